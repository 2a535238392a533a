package auditchain_test

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/subjects"
)

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestCheckpointCost measures the CPU this process (the checkpointer, and
// the embedded server answering its direct gets) spends per audit event
// covered, for events of a terminal event's size; docs/audit.md sets it
// against the audit stage's own CPU per event.
func TestCheckpointCost(t *testing.T) {
	if testing.Short() {
		t.Skip()
	}
	tr := newTrail(t)
	const n = 20000
	pad := strings.Repeat("x", 500)
	pub0 := processCPU()
	for i := range n {
		tr.publish(subjects.AuditEvent("acme", "tool.succeeded"), fmt.Appendf(nil,
			`{"specversion":"1.0","id":"inv-%d:tool.succeeded","source":"urn:toolgate:audit","type":"ai.agent.tool.succeeded","datacontenttype":"application/json","time":"2026-11-27T05:08:15.040990875Z","data":{"tenant_id":"acme","invocation_id":"inv-%d","tool_id":"echo","tool_version":"1.0.0","status":"success","duration_ms":3,"result":{"echo":"%s"}},"tenantid":"acme"}`, i, i, pad))
	}
	pubCPU := processCPU() - pub0
	c := tr.checkpointer(auditchain.DefaultEvery)
	// The store's own work after the publishes is not the checkpointer's.
	time.Sleep(200 * time.Millisecond)
	runtime.GC()
	if p := os.Getenv("AUDITCHAIN_CPUPROFILE"); p != "" {
		f, _ := os.Create(p)
		_ = pprof.StartCPUProfile(f)
	}
	cpu0, wall0 := processCPU(), time.Now()
	for {
		more, err := c.Step(tr.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !more {
			break
		}
	}
	cpu, wall := processCPU()-cpu0, time.Since(wall0)
	pprof.StopCPUProfile()
	if r := tr.verify(auditchain.Options{}); !r.Intact() || r.Events != n {
		t.Fatalf("report %+v", r)
	}
	t.Logf("%d events, %d per checkpoint: %v CPU (%.1f µs per event), %v wall; publishing them: %.1f µs CPU per event",
		n, auditchain.DefaultEvery, cpu, float64(cpu.Microseconds())/n, wall, float64(pubCPU.Microseconds())/n)
}
