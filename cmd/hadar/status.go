package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

// runStatus is `hadar status [job]`: the sidecar's view of the cluster, or
// of one job, read from its status API (the same one the page polls).
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hadar status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c statusConn
	fs.StringVar(&c.addr, "address", "", "the sidecar's status API: host:port, or an http:// or https:// URL (default $HADAR_ADDR, else "+config.DefaultHTTPAddress+")")
	fs.StringVar(&c.addr, "addr", "", "the same as -address")
	fs.StringVar(&c.token, "token", "", "token for a status API that asks for one: its own token or a Nomad ACL token (default $HADAR_TOKEN, else $NOMAD_TOKEN)")
	fs.StringVar(&c.caCert, "ca-cert", "", "CA certificate (PEM) to verify an https status API with (default $HADAR_CACERT)")
	fs.StringVar(&c.clientCert, "client-cert", "", "client certificate (PEM) for a status API that checks them (default $HADAR_CLIENT_CERT)")
	fs.StringVar(&c.clientKey, "client-key", "", "key of -client-cert (default $HADAR_CLIENT_KEY)")
	namespace := fs.String("namespace", "", "show only this namespace's jobs (default $HADAR_NAMESPACE, else $NOMAD_NAMESPACE, else all; \"*\" for all)")
	asJSON := fs.Bool("json", false, "print the API's JSON answer")
	decisions := fs.Int("decisions", 10, "recent decisions to print")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: hadar status [flags] [namespace/job | job]\n\nWithout a job: the cluster's GPUs, the running jobs and the queue. With one: that job, why it waits or where it runs, and where it ran.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	if fs.NArg() > 1 {
		fs.Usage()
		return errUsage
	}
	c = c.withEnv(os.Getenv)
	base, client, err := statusClient(c)
	if err != nil {
		return err
	}
	path := "/v1/status"
	if fs.NArg() == 1 {
		path = "/v1/jobs/" + strings.Trim(fs.Arg(0), "/")
	}
	if ns := namespaceOf(*namespace); ns != "" {
		path += "?namespace=" + url.QueryEscape(ns)
	}
	body, err := fetchStatus(ctx, client, base, path, c.token)
	if err != nil {
		return err
	}
	if *asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var b strings.Builder
	if fs.NArg() == 1 {
		var d wire.JobDetail
		if err := json.Unmarshal(body, &d); err != nil {
			return fmt.Errorf("reading %s%s: %w", base, path, err)
		}
		writeJob(&b, d)
	} else {
		var st wire.Status
		if err := json.Unmarshal(body, &st); err != nil {
			return fmt.Errorf("reading %s%s: %w", base, path, err)
		}
		writeStatus(&b, base, st, *decisions)
	}
	_, err = io.WriteString(stdout, b.String())
	return err
}

// statusConn is how `hadar status` reaches the sidecar's status API.
type statusConn struct {
	addr, token                   string
	caCert, clientCert, clientKey string
}

// withEnv fills what the flags left empty from HADAR_* (the status API's
// own), then NOMAD_TOKEN: a Nomad ACL token is what a sidecar with
// nomad_auth accepts.
func (c statusConn) withEnv(getenv func(string) string) statusConn {
	c.addr = cmp.Or(c.addr, getenv("HADAR_ADDR"), config.DefaultHTTPAddress)
	c.token = cmp.Or(c.token, getenv("HADAR_TOKEN"), getenv("NOMAD_TOKEN"))
	c.caCert = cmp.Or(c.caCert, getenv("HADAR_CACERT"))
	c.clientCert = cmp.Or(c.clientCert, getenv("HADAR_CLIENT_CERT"))
	c.clientKey = cmp.Or(c.clientKey, getenv("HADAR_CLIENT_KEY"))
	return c
}

// statusClient turns the address into a base URL and an HTTP client for it.
func statusClient(c statusConn) (string, *http.Client, error) {
	addr := c.addr
	base := addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
		if c.caCert != "" || c.clientCert != "" {
			base = "https://" + addr
		}
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", nil, fmt.Errorf("-address %q: want host:port or an http:// or https:// URL, e.g. %q", addr, config.DefaultHTTPAddress)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.caCert != "" {
		pem, err := os.ReadFile(c.caCert)
		if err != nil {
			return "", nil, fmt.Errorf("-ca-cert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return "", nil, fmt.Errorf("-ca-cert %s: no PEM certificate in it", c.caCert)
		}
		cfg.RootCAs = pool
	}
	if (c.clientCert == "") != (c.clientKey == "") {
		return "", nil, fmt.Errorf("-client-cert and -client-key go together; got cert %q, key %q", c.clientCert, c.clientKey)
	}
	if c.clientCert != "" {
		cert, err := tls.LoadX509KeyPair(c.clientCert, c.clientKey)
		if err != nil {
			return "", nil, fmt.Errorf("-client-cert %s, -client-key %s: %w", c.clientCert, c.clientKey, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	tr.TLSClientConfig = cfg
	return strings.TrimRight(u.String(), "/"), &http.Client{Transport: tr, Timeout: 15 * time.Second}, nil
}

func fetchStatus(ctx context.Context, client *http.Client, base, path, token string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the sidecar at %s: %w (is `hadar sidecar` running there? -address says where)", base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading %s%s: %w", base, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		msg := resp.Status
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			return nil, fmt.Errorf("%s%s: %s (give -token, HADAR_TOKEN or NOMAD_TOKEN)", base, path, msg)
		case http.StatusForbidden:
			return nil, fmt.Errorf("%s%s: %s", base, path, msg)
		}
		if e.Error != "" {
			return nil, errors.New(e.Error)
		}
		return nil, fmt.Errorf("%s%s: %s", base, path, resp.Status)
	}
	return body, nil
}

// table starts a table with its header line.
func table(b *strings.Builder, header string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	return tw
}

func ago(s float64) string {
	if s <= 0 || math.IsNaN(s) {
		return "-"
	}
	return (time.Duration(s) * time.Second).Round(time.Second).String()
}

// units writes a placement as 2xv100@node/rack, naming nodes by name
// where names knows them, else by their whole ID (a caller without node
// read sees no node names): a prefix could name several nodes, and
// `nomad node status` takes the whole ID.
func units(us []wire.UnitView, names map[string]string) string {
	if len(us) == 0 {
		return "-"
	}
	var parts []string
	for _, u := range us {
		var ss []string
		for _, s := range u.Slots {
			node := names[s.Node]
			if node == "" {
				node = s.Node
			}
			ss = append(ss, fmt.Sprintf("%dx%s@%s/%s", s.Count, s.Type, node, s.Rack))
		}
		parts = append(parts, strings.Join(ss, "+"))
	}
	return strings.Join(parts, " | ")
}

func waits(w string) string {
	switch w {
	case wire.PendingHeld:
		return "held by hadar"
	case wire.PendingNoCapacity:
		return "no capacity"
	}
	return w
}

// asOf says how old progress reported at is, at ref: a view read between
// reports shows the last one, and the reader must know how old it is.
func asOf(at *time.Time, ref time.Time) string {
	if at == nil {
		return " no report yet"
	}
	if ref.IsZero() {
		ref = time.Now()
	}
	return fmt.Sprintf(" as of %s ago", (max(0, ref.Sub(*at))).Round(time.Second))
}

func when(t *time.Time, s float64) string {
	if t == nil {
		return "-"
	}
	return fmt.Sprintf("%s (in %s)", t.Local().Format("15:04:05"), ago(s))
}

func writeStatus(b *strings.Builder, base string, st wire.Status, decisions int) {
	sc := st.Sidecar
	health := "healthy"
	if !sc.OK {
		health = "NOT READY: " + sc.Problem
	}
	role := "leader"
	if !sc.Leader {
		role = "follower (read only)"
	}
	fmt.Fprintf(b, "hadar sidecar %s: %s; policy %s, placement %s; %s; round %d", base, health, sc.Policy, sc.Placement, role, sc.Round)
	if next := sc.NextRound.Sub(st.Time); next > 0 {
		fmt.Fprintf(b, ", next in %s", next.Round(time.Second))
	}
	if sc.DryRun {
		b.WriteString("; dry run: writes nothing")
	}
	b.WriteString("\n\n")

	tw := table(b, "GPU TYPE\tTOTAL\tHADAR\tOTHER\tIDLE")
	for _, g := range st.GPUs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", g.Type, g.Total, g.Allocated, g.Unmanaged, g.Idle)
	}
	tw.Flush()
	b.WriteString("\n")

	names := map[string]string{}
	tw = table(b, "RACK\tNODE\tSTATUS\tGPUS\tJOBS")
	for _, r := range st.Racks {
		for _, n := range r.Nodes {
			names[n.ID] = n.Name
		}
		for _, n := range r.Nodes {
			state := n.Status
			if !n.Schedulable {
				state += ", no new work"
			}
			if len(n.GPUs) == 0 {
				fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\n", r.Rack, n.Name, state)
			}
			for _, g := range n.GPUs {
				var hs []string
				for _, h := range g.Holders {
					job := h.Job
					if job == "" {
						job = "(a job of another namespace)"
					}
					s := fmt.Sprintf("%s x%d", job, h.Count)
					if !h.Managed {
						s += " (not hadar's)"
					}
					hs = append(hs, s)
				}
				if idle := g.Healthy - g.Held(); idle > 0 {
					hs = append(hs, fmt.Sprintf("%d idle", idle))
				}
				typ := string(g.Type)
				if typ == "" {
					typ = strings.Join(g.Models, ",") + " (not mapped)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s %d/%d\t%s\n", r.Rack, n.Name, state, typ, g.Healthy, g.Total, strings.Join(hs, ", "))
			}
		}
	}
	tw.Flush()

	fmt.Fprintf(b, "\nRUNNING (%d)\n", len(st.Running))
	if len(st.Running) > 0 {
		tw := table(b, "JOB\tSTATE\tGPUS\tPROGRESS\tRATE\tETA")
		for _, j := range st.Running {
			state := j.State
			if j.StalledS > 0 {
				// A hang holds GPUs and makes nothing: the operator's to act on.
				state += ", stalled " + ago(j.StalledS)
			}
			if len(j.Widths) > 1 {
				state += ", " + wire.WorkersText(j.Workers, j.Widths, wire.Width(j.Units))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%3.0f%% (%.0f/%.0f)%s\t%.1f steps/s\t%s\n", j.ID, state, units(j.Units, names), 100*j.Progress, j.StepsDone, j.Steps, asOf(j.ProgressAt, st.Time), j.Rate, when(j.ETA, j.ETAS))
		}
		tw.Flush()
		// Elastic jobs: the width the policy chose, and why.
		for _, j := range st.Running {
			if len(j.Widths) > 1 && j.Why != "" {
				fmt.Fprintf(b, "%s: %s: %s\n", j.ID, wire.WorkersText(j.Workers, j.Widths, wire.Width(j.Units)), j.Why)
			}
		}
	}

	fmt.Fprintf(b, "\nQUEUE (%d)\n", len(st.Queue))
	if len(st.Queue) > 0 {
		tw := table(b, "#\tJOB\tWAITS\tFOR\tNEEDS\tWHY")
		for _, q := range st.Queue {
			why := q.Why
			if q.Nomad != "" {
				why += " (Nomad: " + q.Nomad + ")"
			}
			needs := strconv.Itoa(q.Workers)
			if len(q.Widths) > 1 {
				needs = wire.WidthsText(q.Widths)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%sx %s\t%s\n", q.Position, q.ID, waits(q.Waits), ago(q.WaitingS), needs, strings.Join(q.RunsOn, "|"), why)
		}
		tw.Flush()
	}
	if len(st.Refused) > 0 {
		fmt.Fprintf(b, "\nREFUSED (%d)\n", len(st.Refused))
		for _, r := range st.Refused {
			fmt.Fprintf(b, "%s: %s\n", r.Job, r.Error)
		}
	}
	evs := st.Decisions
	if len(evs) > decisions {
		evs = evs[len(evs)-decisions:]
	}
	if len(evs) > 0 {
		fmt.Fprintf(b, "\nRECENT DECISIONS (newest last)\n")
		writeEvents(b, evs)
	}
}

func writeEvents(b *strings.Builder, evs []wire.Event) {
	tw := table(b, "TIME\tJOB\tACTION\tWHY")
	for _, ev := range evs {
		action := string(ev.Action)
		if action == "" {
			action = "outcome"
		}
		why := ev.Why
		if ev.Result != "" {
			why = strings.TrimSpace(why + " [" + ev.Result + "]")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", ev.Time.Local().Format("15:04:05"), ev.Job, action, why)
	}
	tw.Flush()
}

func writeJob(b *strings.Builder, d wire.JobDetail) {
	fmt.Fprintf(b, "job %s: %s\n", d.ID, d.State)
	if j := d.Job; j != nil {
		fmt.Fprintf(b, "model %s, %s, weight %g\n", j.Model, wire.WorkersText(j.Workers, j.Widths, wire.Width(j.Units)), j.Weight)
		fmt.Fprintf(b, "progress %.0f%% (%.0f of %.0f steps)%s", 100*d.Progress, j.StepsDone, j.Steps, asOf(d.ProgressAt, time.Now()))
		if j.StalledS > 0 {
			fmt.Fprintf(b, ", stalled: no step for %s", ago(j.StalledS))
		}
		if len(j.Units) > 0 {
			fmt.Fprintf(b, " at %.1f steps/s, ETA %s\nruns on %s", j.Rate, when(d.ETA, j.ETA), units(j.Units, d.NodeNames))
		}
		b.WriteString("\n")
		if d.QueuePosition > 0 {
			fmt.Fprintf(b, "waits: #%d of %d in the queue, %s, for %s\n", d.QueuePosition, d.QueueLength, waits(d.Waits), ago(j.WaitingS))
		}
		if len(j.Throughput) > 0 {
			types := make([]string, 0, len(j.Throughput))
			for t := range j.Throughput {
				types = append(types, t)
			}
			sort.Strings(types)
			var ts []string
			for _, t := range types {
				ts = append(ts, fmt.Sprintf("%s %.1f steps/s", t, j.Throughput[t]))
			}
			fmt.Fprintf(b, "runs on: %s\n", strings.Join(ts, ", "))
		}
	}
	if d.Why != "" {
		fmt.Fprintf(b, "why: %s\n", d.Why)
	}
	if d.Nomad != "" {
		fmt.Fprintf(b, "Nomad: %s\n", d.Nomad)
	}
	if len(d.Placements) > 0 {
		fmt.Fprintf(b, "\nPLACEMENTS (oldest first)\n")
		tw := table(b, "TIME\tACTION\tGPUS\tWHY")
		for _, p := range d.Placements {
			why := p.Why
			if p.Result != "" {
				why = strings.TrimSpace(why + " [" + p.Result + "]")
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Time.Local().Format("15:04:05"), p.Action, units(p.Units, d.NodeNames), why)
		}
		tw.Flush()
	}
}
