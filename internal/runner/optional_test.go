package runner

import (
	"context"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/stages"
)

type plainStage struct{}

func (plainStage) Process(context.Context, *envelope.Invocation) ([]stages.Output, error) {
	return nil, nil
}

type decodingStage struct{ plainStage }

func (decodingStage) Decode(subject string, _ map[string][]string, data []byte, seq uint64, _ time.Time) (*envelope.Invocation, error) {
	return &envelope.Invocation{ID: subject + ":" + string(data)}, nil
}

type finalStage struct{ plainStage }

func (finalStage) Finalises() {}

// TestOptionalStageInterfaces: the Runner decodes and settles by what the
// stage implements, not by its name.
func TestOptionalStageInterfaces(t *testing.T) {
	t.Run("a Decoder decodes raw messages itself", func(t *testing.T) {
		r := &Runner{Name: "audit", Stage: decodingStage{}}
		inv, err := r.decode("s", nil, []byte("raw"), 1)
		if err != nil || inv == nil || inv.ID != "s:raw" {
			t.Fatalf("decoded %+v, %v", inv, err)
		}
	})
	t.Run("other stages read the envelope", func(t *testing.T) {
		r := &Runner{Name: "validate", Stage: plainStage{}}
		if inv, err := r.decode("s", nil, []byte(`{"id":"i-1"}`), 1); err != nil || inv.ID != "i-1" {
			t.Fatalf("decoded %+v, %v", inv, err)
		}
		if inv, _ := r.decode("s", nil, []byte("raw"), 1); inv != nil {
			t.Fatalf("raw bytes decoded as an envelope: %+v", inv)
		}
	})
	t.Run("a Finaliser finalises under any name", func(t *testing.T) {
		if !(&Runner{Name: "verify", Stage: finalStage{}}).finalises() {
			t.Fatal("finaliser not recognised")
		}
		if (&Runner{Name: "audit", Stage: plainStage{}}).finalises() {
			t.Fatal("a plain stage named audit finalises")
		}
	})
}
