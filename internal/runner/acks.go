package runner

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	segjson "github.com/segmentio/encoding/json"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/subjects"
)

// HandoffAcks returns js with the Runner's hand-offs (the messages it
// publishes as its own, seal.PublishOwnedAsync) sent on js's connection
// with a reply subject of its own, their acknowledgements read by its own
// subscription: the client's asynchronous publisher decodes each with
// encoding/json under a lock every publish of the process shares, which
// cost more than the rest of a hop's settling. The message on the bus is
// the same; everything else js publishes goes through the client as before
// (its acknowledgement handler included). A hand-off gets no retry when no
// stream answers: it fails, and the Runner naks its input for a retry
// after its backoff.
func HandoffAcks(js jetstream.JetStream) jetstream.JetStream {
	return &handoffAcks{JetStream: js, pending: map[uint64]*handoffAck{}, horizon: ackHorizon}
}

// A hand-off still waiting ackHorizon publishes later, and sent over
// ackPatience ago, fails: its acknowledgement was lost without the
// connection being lost (a stream leader gone), and its waiter gave up
// long since; it is not kept, message and all, until a reconnect.
const (
	ackHorizon  = 1 << 14
	ackPatience = time.Minute
)

type handoffAcks struct {
	jetstream.JetStream
	start  sync.Once
	prefix string // the reply subjects', up to the token
	err    error  // why the subscription could not be made

	mu      sync.Mutex
	pending map[uint64]*handoffAck // by token
	next    uint64
	horizon uint64 // ackHorizon
}

// handoffAck is a hand-off's jetstream.PubAckFuture: exactly one of its
// channels receives, once.
type handoffAck struct {
	msg  *nats.Msg
	ok   chan *jetstream.PubAck
	err  chan error
	sent time.Time
}

func (a *handoffAck) Ok() <-chan *jetstream.PubAck { return a.ok }
func (a *handoffAck) Err() <-chan error            { return a.err }
func (a *handoffAck) Msg() *nats.Msg               { return a.msg }

// errNoStream is a hand-off's failure when no stream took it, errLostAck
// when no acknowledgement came (ackPatience).
var (
	errNoStream = errors.New("no stream answered the hand-off")
	errLostAck  = errors.New("no acknowledgement of the hand-off came")
)

// listen subscribes to the reply subjects, once, and fails what is pending
// whenever the connection is lost: an acknowledgement sent then never
// comes.
func (j *handoffAcks) listen() error {
	j.start.Do(func() {
		nc := j.Conn()
		inbox := nc.NewInbox()
		j.prefix = inbox + "."
		if _, j.err = nc.Subscribe(inbox+".*", j.reply); j.err != nil {
			return
		}
		lost := nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
		go func() {
			for st := range lost {
				j.failAll(nats.ErrDisconnected)
				if st == nats.CLOSED {
					return
				}
			}
		}()
	})
	return j.err
}

// PublishOwnedAsync publishes m, a hand-off the caller made for this
// publish alone, with its reply subject set here; anything but a hand-off
// between the hub's stages, or one with options (a hand-off's id is in
// its header), goes through the client.
func (j *handoffAcks) PublishOwnedAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if _, pipe := subjects.StageOfPipe(m.Subject); !pipe || len(opts) > 0 || m.Reply != "" {
		return j.PublishMsgAsync(m, opts...)
	}
	if err := j.listen(); err != nil {
		return nil, err
	}
	a := &handoffAck{msg: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1), sent: time.Now()}
	j.mu.Lock()
	j.next++
	token := j.next
	j.pending[token] = a
	old, stale := j.pending[token-j.horizon]
	if stale = stale && a.sent.Sub(old.sent) > ackPatience; stale {
		delete(j.pending, token-j.horizon)
	}
	j.mu.Unlock()
	if stale {
		old.err <- errLostAck
	}
	var buf [80]byte
	m.Reply = string(strconv.AppendUint(append(buf[:0], j.prefix...), token, 36))
	if err := j.Conn().PublishMsg(m); err != nil {
		j.mu.Lock()
		delete(j.pending, token)
		j.mu.Unlock()
		return nil, err
	}
	return a, nil
}

// pubAckReply is a stream's answer to a publish.
type pubAckReply struct {
	jetstream.PubAck
	Error *jetstream.APIError `json:"error,omitempty"`
}

// reply settles the hand-off an acknowledgement answers.
func (j *handoffAcks) reply(r *nats.Msg) {
	token, err := strconv.ParseUint(r.Subject[min(len(j.prefix), len(r.Subject)):], 36, 64)
	if err != nil {
		return
	}
	j.mu.Lock()
	a, ok := j.pending[token]
	delete(j.pending, token)
	j.mu.Unlock()
	if !ok {
		return
	}
	if len(r.Data) == 0 {
		// A status without a body: no responders, or another the client
		// would not take for an acknowledgement either.
		a.err <- errNoStream
		return
	}
	var ack pubAckReply
	// The stream's name points into r's data, which is this reply's alone.
	switch _, err := segjson.Parse(r.Data, &ack, segjson.ZeroCopy); {
	case err != nil:
		a.err <- jetstream.ErrInvalidJSAck
	case ack.Error != nil:
		a.err <- ack.Error
	case ack.Stream == "":
		a.err <- jetstream.ErrInvalidJSAck
	default:
		a.ok <- &ack.PubAck
	}
}

// failAll fails every hand-off waiting for its acknowledgement with err.
func (j *handoffAcks) failAll(err error) {
	j.mu.Lock()
	pending := j.pending
	j.pending = map[uint64]*handoffAck{}
	j.mu.Unlock()
	for _, a := range pending {
		a.err <- err
	}
}

var _ seal.OwnedPublisher = (*handoffAcks)(nil)
