package runner

import (
	"time"

	"github.com/toolgate/toolgate/api"
	backoffs "github.com/toolgate/toolgate/internal/backoff"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// action is what the Runner does with a message once its stage has answered.
type action int

const (
	// actForward publishes the invocation to settlement.next, then acks.
	actForward action = iota
	// actDone acks: the invocation has left the pipeline (after audit).
	actDone
	// actRetry naks with settlement.delay.
	actRetry
	// actTerm stops redelivery of a message that can never succeed.
	actTerm
)

type settlement struct {
	act   action
	next  string
	delay time.Duration
}

// settle decides the fate of a message from its stage's answer; final is
// set for a stages.Finaliser. It is the one place where the pipeline's
// settlement rules live; see the package comment. It may end inv (Fail) but
// does no I/O.
func settle(stage string, final bool, inv *envelope.Invocation, err error, delivered, maxDeliver int) settlement {
	if delay, ok := stages.IsTransient(err); ok {
		if maxDeliver <= 0 || delivered < maxDeliver {
			if delay <= 0 {
				delay = backoff(delivered)
			}
			return settlement{act: actRetry, delay: delay}
		}
		if final {
			return settlement{act: actTerm}
		}
		inv.Fail(stage, api.WrapError(err, api.InternalError, api.EDeliveryExhausted,
			"%s gave up after %d deliveries: %v", stage, delivered, err))
		return settlement{act: actForward, next: subjects.Audit}
	}
	if final {
		if err != nil {
			return settlement{act: actTerm}
		}
		return settlement{act: actDone}
	}
	if err != nil {
		inv.Fail(stage, err)
	}
	if inv.Terminal() {
		return settlement{act: actForward, next: subjects.Audit}
	}
	if inv.Parked() {
		// Its outputs are published and the input acked; a decision
		// outside the pipeline resumes or ends it.
		return settlement{act: actDone}
	}
	return settlement{act: actForward, next: subjects.Next(stage)}
}

// backoff is the wait before delivery n+1 after a transient failure:
// exponential, 2s·2^(n-1) capped at 30s, with half of it jittered. Its
// first four waits add up to 15-30 s, so the default five deliveries ride
// out a cluster's leader election or a node's restart (which the transient
// failures of a bus hop mostly are) instead of ending the invocation with
// E3901 while it lasts.
func backoff(delivered int) time.Duration {
	d := backoffs.Exponential(delivered, 2*time.Second, 30*time.Second)
	return d/2 + backoffs.FullJitter(1, d/2, d/2)
}
