package kvstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotBound is returned by every operation on a bucket the store was not
// opened with (Options.Buckets): the connection's role has no rights there,
// so the call is refused here, at once, with the bucket's name, rather
// than by the server after a timeout.
var ErrNotBound = errors.New("kvstore: bucket not opened for this role")

// unbound is a bucket the store was not opened with.
type unbound struct{ bucket string }

func (u unbound) err() error { return fmt.Errorf("%w: %s", ErrNotBound, u.bucket) }

func (u unbound) Get(context.Context, string) (jetstream.KeyValueEntry, error) { return nil, u.err() }
func (u unbound) GetRevision(context.Context, string, uint64) (jetstream.KeyValueEntry, error) {
	return nil, u.err()
}
func (u unbound) Put(context.Context, string, []byte) (uint64, error)       { return 0, u.err() }
func (u unbound) PutString(context.Context, string, string) (uint64, error) { return 0, u.err() }
func (u unbound) Create(context.Context, string, []byte, ...jetstream.KVCreateOpt) (uint64, error) {
	return 0, u.err()
}
func (u unbound) Update(context.Context, string, []byte, uint64) (uint64, error) { return 0, u.err() }
func (u unbound) Delete(context.Context, string, ...jetstream.KVDeleteOpt) error { return u.err() }
func (u unbound) Purge(context.Context, string, ...jetstream.KVDeleteOpt) error  { return u.err() }
func (u unbound) Watch(context.Context, string, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return nil, u.err()
}
func (u unbound) WatchAll(context.Context, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return nil, u.err()
}
func (u unbound) WatchFiltered(context.Context, []string, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return nil, u.err()
}
func (u unbound) Keys(context.Context, ...jetstream.WatchOpt) ([]string, error) { return nil, u.err() }
func (u unbound) ListKeys(context.Context, ...jetstream.WatchOpt) (jetstream.KeyLister, error) {
	return nil, u.err()
}
func (u unbound) ListKeysFiltered(context.Context, ...string) (jetstream.KeyLister, error) {
	return nil, u.err()
}
func (u unbound) History(context.Context, string, ...jetstream.WatchOpt) ([]jetstream.KeyValueEntry, error) {
	return nil, u.err()
}
func (u unbound) Bucket() string                                              { return u.bucket }
func (u unbound) PurgeDeletes(context.Context, ...jetstream.KVPurgeOpt) error { return u.err() }
func (u unbound) Status(context.Context) (jetstream.KeyValueStatus, error)    { return nil, u.err() }
