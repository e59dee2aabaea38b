package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hadar-sched/hadar/internal/hostpath"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// queuesPage is what the page shows of the team queues: each row of the
// Queues table by queue name, its cells' text, and the waiting jobs'
// team queue and queue reason.
type queuesPage struct {
	Hidden  bool                `json:"hidden"`
	Rows    map[string][]string `json:"rows"`
	Waiting map[string]string   `json:"waiting"` // job -> "team queue/queue reason"
	Why     map[string]string   `json:"why"`     // job -> its why cell's text
	Text    string              `json:"text"`
}

const readQueuesPage = `(() => {
  const v = {hidden: document.getElementById('queues-section').hidden, rows: {}, waiting: {}, why: {}};
  for (const tr of document.querySelectorAll('#queues tbody tr[data-queue]')) v.rows[tr.dataset.queue] = [...tr.cells].map(td => td.innerText);
  for (const tr of document.querySelectorAll('#queue tbody tr[data-job]')) {
    v.waiting[tr.dataset.job] = tr.dataset.teamQueue + '/' + tr.dataset.queueReason;
    v.why[tr.dataset.job] = tr.cells[5].innerText;
  }
  v.text = document.body.innerText;
  return v;
})()`

// gpuText is a per-type GPU count as the page writes it: "2 p100, 4
// v100", "-" for none.
func gpuText(m map[string]int) string {
	var parts []string
	for t, n := range m {
		parts = append(parts, fmt.Sprintf("%d %s", n, t))
	}
	if len(parts) == 0 {
		return "-"
	}
	sort.Slice(parts, func(i, j int) bool { return strings.SplitN(parts[i], " ", 2)[1] < strings.SplitN(parts[j], " ", 2)[1] })
	return strings.Join(parts, ", ")
}

// TestQueuesPageInChromium: on a sidecar with team queues, the status
// page in a real headless Chromium shows a Queues section with one row
// per queue of GET /v1/queues (policy, guaranteed, used, borrowed and
// limit GPUs per type, pending and admitted jobs), and the waiting job of
// a queue at its limit with its team queue and that reason.
func TestQueuesPageInChromium(t *testing.T) {
	skipShort(t)
	ctx := browser(t)
	c := startSidecarCluster(t)
	const policy = "fifo"
	cfg := config.Config{
		Scheduling: config.Scheduling{Policy: policy},
		TeamQueues: config.TeamQueues{Queues: []queue.Block{
			{Name: "team-a", MetaNamespaces: []string{"*"}, Guarantee: map[string]int{"v100": 2}},
			{Name: "team-c", MetaNamespaces: []string{"*"}, Limit: map[string]int{"v100": 0, "p100": 0, "k80": 0}},
		}},
	}
	a := c.startSidecar(cfg)
	s := c.startStatus(t, a, policy)
	job := func(id, team string) scJob {
		return scJob{id: id, steps: 10_000_000, workers: 2, gated: true, extra: fmt.Sprintf("    \"hadar.queue\" = %q", team)}
	}
	c.submit(job("a1", "team-a"))
	c.submit(job("c1", "team-c"))
	c.waitFor("a1 runs and c1 waits at its queue's limit", 5*time.Minute, func() error {
		if jv := c.planOf(a, "a1"); jv.State != "running" || len(c.running("a1")) == 0 {
			return fmt.Errorf("a1: %s", jv.State)
		}
		if jv := c.planOf(a, "c1"); jv.QueueReason != queue.ReasonAtLimit {
			return fmt.Errorf("c1: queue %q, queue reason %q", jv.TeamQueue, jv.QueueReason)
		}
		return nil
	})

	var mu sync.Mutex
	var complaints []string
	cctx, stopConsole := context.WithCancel(ctx)
	messages := chromedp.Console(cctx)
	consoleDone := make(chan struct{})
	go func() {
		defer close(consoleDone)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleException || m.Type == chromedp.ConsoleError {
				mu.Lock()
				complaints = append(complaints, fmt.Sprintf("%s %s (%s:%d)", m.Type, m.Text, m.URL, m.Line+1))
				mu.Unlock()
			}
		}
	}()
	nctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(nctx, chromedp.Navigate(s.base+"/?refresh=0.5"), chromedp.WaitVisible(chromedp.CSS("#queues tbody tr[data-queue]"))); err != nil {
		t.Fatalf("loading the page: %v", err)
	}

	// Every queue of the API's answer has its row, saying what the API
	// says (read again until a page and an answer of the same plan meet).
	var v queuesPage
	c.waitFor("the page's queues match /v1/queues", time.Minute, func() error {
		code, body := s.get(t, "/v1/queues")
		var api wire.Queues
		if err := json.Unmarshal([]byte(body), &api); code != 200 || err != nil {
			return fmt.Errorf("GET /v1/queues: %d %v\n%s", code, err, body)
		}
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		defer rcancel()
		var err error
		if v, err = chromedp.Run(rctx, chromedp.Evaluate[queuesPage](readQueuesPage)); err != nil {
			return fmt.Errorf("reading the page: %w", err)
		}
		if v.Hidden || len(v.Rows) != len(api.Queues) || len(api.Queues) < 2 {
			return fmt.Errorf("the page shows queues %v (hidden %t), the API %d: %s", v.Rows, v.Hidden, len(api.Queues), body)
		}
		for _, q := range api.Queues {
			limit := gpuText(q.Limit)
			if len(q.Limit) == 0 {
				limit = "none"
			}
			guar := gpuText(q.Guarantee)
			if q.Scaled {
				guar += " (scaled)"
			}
			want := []string{q.Name, q.Policy, guar, gpuText(q.Used), gpuText(q.Borrowed), limit, strconv.Itoa(q.Pending), strconv.Itoa(q.Admitted)}
			row := v.Rows[q.Name]
			if len(row) < len(want) {
				return fmt.Errorf("queue %s: row %q", q.Name, row)
			}
			got := append([]string(nil), row[:len(want)]...)
			got[6], _, _ = strings.Cut(got[6], "\n") // the count above the reasons
			if strings.Join(got, "|") != strings.Join(want, "|") {
				return fmt.Errorf("queue %s: the page shows %q, the API %q", q.Name, got, want)
			}
		}
		return nil
	})
	// The figures themselves: team-a holds a1's two GPUs and is
	// guaranteed two V100s; team-c waits at its limit of nothing.
	if r := v.Rows["team-a"]; r[1] != policy || r[2] != "2 v100" || r[7] != "1" || r[3] == "-" {
		t.Errorf("team-a's row %q: want policy %s, 2 v100 guaranteed, one job admitted holding GPUs", r, policy)
	}
	if r := v.Rows["team-c"]; r[5] != "0 k80, 0 p100, 0 v100" || !strings.HasPrefix(r[6], "1") || !strings.Contains(r[6], "at limit \u00d71") || r[7] != "0" {
		t.Errorf("team-c's row %q: want limit 0 of each type, one job pending at its limit", r)
	}
	// The waiting job says which queue holds it, and why.
	if got := v.Waiting["default/c1"]; got != "team-c/"+queue.ReasonAtLimit {
		t.Errorf("c1 in the page's waiting jobs: %q (team queue/queue reason), want team-c/at_limit; all: %v", got, v.Waiting)
	}
	if why := v.Why["default/c1"]; !strings.Contains(why, "queue team-c") || !strings.Contains(why, "at limit") {
		t.Errorf("c1's why on the page %q does not name its queue and reason", why)
	}
	for _, bad := range []string{"undefined", "NaN", "null", "[object"} {
		if strings.Contains(v.Text, bad) {
			t.Errorf("the page shows %q:\n%s", bad, v.Text)
		}
	}
	// A screenshot to look at (copied to out/queues-page.png).
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	shot, err := chromedp.Run(sctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if root, err := hostpath.RepoRoot(); err == nil {
		if err := os.MkdirAll(filepath.Join(root, "out"), 0o755); err == nil {
			os.WriteFile(filepath.Join(root, "out", "queues-page.png"), shot, 0o644)
		}
	}
	stopConsole()
	<-consoleDone
	mu.Lock()
	defer mu.Unlock()
	for _, m := range complaints {
		t.Errorf("the browser reports %s", m)
	}
}
