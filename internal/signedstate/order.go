package signedstate

import (
	"fmt"
	"sync"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/kvstore"
)

// Order refuses replayed state: a record whose operator's request was
// signed before the one a reader already honours for the same key. Each
// record verifies on its own, so without it whoever may write a bucket
// could put back an older signed policy, hook set, manifest or model over
// a newer one (or over its removal) and have it honoured. A reader keeps
// one Order per kind of state; it remembers what this process has seen,
// so a reader started after the replay honours what the bucket holds.
type Order struct {
	mu     sync.Mutex
	newest map[string]time.Time
}

// Admit records that the reader honours for key the record signed by p,
// or returns why it must not: its request is older than the one in force
// (or than the one last removed). Records that say nothing of when they
// were signed are admitted in any order.
func (o *Order) Admit(key string, p *api.DecisionProof) error {
	at := SignedAt(p)
	if at.IsZero() {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if prev, ok := o.newest[key]; ok && at.Before(prev) {
		return fmt.Errorf("a replayed record: its operator's request was signed at %s, before the one in force for %s (%s)",
			at.UTC().Format(time.RFC3339Nano), key, prev.UTC().Format(time.RFC3339Nano))
	}
	if o.newest == nil {
		o.newest = map[string]time.Time{}
	}
	o.newest[key] = at
	return nil
}

// Removed records that key's record was removed: the record last honoured
// for it may not come back, only one signed after it.
func (o *Order) Removed(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if prev, ok := o.newest[key]; ok {
		o.newest[key] = prev.Add(time.Millisecond) // requests are signed to the millisecond
	}
}

// Policy is Policy, then Admit under the bundle's one key.
func (o *Order) Policy(b kvstore.PolicyBundle, verify Verify) error {
	if err := Policy(b, verify); err != nil {
		return err
	}
	return o.Admit("policy", b.Proof)
}

// Hooks is Hooks, then Admit under the tenant.
func (o *Order) Hooks(set kvstore.HookSet, verify Verify) error {
	if err := Hooks(set, verify); err != nil {
		return err
	}
	return o.Admit(set.Tenant, set.Proof)
}

// Tool is Tool, then Admit under key.
func (o *Order) Tool(rec kvstore.ToolRecord, key string, verify Verify) error {
	if err := Tool(rec, verify); err != nil {
		return err
	}
	if rec.Removal != nil {
		// The delete came after the register it removes: the record as
		// registered may not come back over it.
		return o.Admit(key, rec.Removal.Proof)
	}
	return o.Admit(key, rec.Proof)
}

// Model is Model, then Admit under key.
func (o *Order) Model(rec kvstore.ModelRecord, key string, verify Verify) error {
	if err := Model(rec, key, verify); err != nil {
		return err
	}
	return o.Admit(key, rec.Proof)
}
