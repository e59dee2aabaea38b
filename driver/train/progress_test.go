package train

import (
	"strings"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/contract"
)

// TestEventTextBounded: a progress file may name a checkpoint of up to
// 1 MiB; the events of a run (resumed, saved, final) carry at most
// 512 bytes of it each (maxEventText), into Nomad's cluster state.
func TestEventTextBounded(t *testing.T) {
	ck := "/ckpt/" + strings.Repeat("é", 1<<19) // 1 MiB of the task's text
	started := time.Now()
	e := &progressEvents{started: started, olderThan: func(string, time.Time) bool { return true }}
	p := &contract.Progress{StepsDone: 10, TotalSteps: 100, Checkpoint: ck, Updated: started}
	evs := e.next(p, false, false)
	p2 := *p
	p2.Checkpoint = ck + "x"
	evs = append(evs, e.next(&p2, true, false)...)
	evs = append(evs, e.next(&p2, false, true)...)
	if len(evs) < 3 {
		t.Fatalf("%d events, want resumed, saved and final", len(evs))
	}
	// Twice the text (message and details), plus the words and numbers.
	const most = 2*512 + 400
	for _, ev := range evs {
		size := len(ev.message)
		for k, v := range ev.details {
			size += len(k) + len(v)
		}
		if size > most {
			t.Errorf("event %.60q...: %d bytes of message and details, want at most %d", ev.message, size, most)
		}
		if !strings.Contains(ev.message, "bytes more") || !strings.Contains(ev.details["hadar.checkpoint"], "bytes more") {
			t.Errorf("event %.60q...: does not say the checkpoint was cut", ev.message)
		}
	}
}
