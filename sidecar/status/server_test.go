package status

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hadar-sched/hadar/sidecar/telemetry"
	"github.com/hadar-sched/hadar/sidecar/watch"
	"github.com/hadar-sched/hadar/sidecar/wire"
)

const token = "5f1c0e2a-9b7d-4c1e-8a55-secret-token"

type fake struct {
	obs  wire.Observation
	hist []wire.Event
}

func (f *fake) Plan() wire.PlanView       { return f.obs.Plan }
func (f *fake) History() []wire.Event     { return f.hist }
func (f *fake) Observe() wire.Observation { return f.obs }
func (f *fake) WatchStats() watch.Stats   { return watch.Stats{} }
func (f *fake) Health() wire.Health       { return wire.Health{OK: true, Replica: "r-1", Leader: true} }

var now = time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)

func scenario() *fake {
	a := wire.JobObservation{JobView: wire.JobView{
		JobIdentity: wire.JobIdentity{ID: "default/a", Namespace: "default", Job: "a", Workers: 2},
		JobDecision: wire.JobDecision{State: "running", Position: -1, Units: []wire.UnitView{{Slots: []wire.SlotView{{Node: "n1", Rack: "r1", Type: "v100", Count: 2}}}}, Reason: wire.Reason{Why: "keeps its GPUs"}},
		JobProgress: wire.JobProgress{StepsDone: 250, Steps: 1000, Rate: 5, ETA: 150},
	}}
	b := wire.JobObservation{JobView: wire.JobView{
		JobIdentity: wire.JobIdentity{ID: "default/b", Namespace: "default", Job: "b", Workers: 4},
		JobDecision: wire.JobDecision{State: "waiting", Position: 1, Reason: wire.Reason{Why: "delay scheduling: waits for 4 v100 GPUs at node level"}},
		JobProgress: wire.JobProgress{WaitingS: 40},
	}, Pending: wire.PendingHeld,
		Throughput: map[string]float64{"v100": 40, "k80": 10}}
	c := wire.JobObservation{JobView: wire.JobView{
		JobIdentity: wire.JobIdentity{ID: "team/c", Namespace: "team", Job: "c", Workers: 8},
		JobDecision: wire.JobDecision{State: "waiting", Position: 0, Reason: wire.Reason{Why: "not placed this round: the policy gave the GPUs it can use to other jobs " + token}, Nomad: "train: 4 nodes exhausted"},
	},
		Pending: wire.PendingNoCapacity, Throughput: map[string]float64{"v100": 80}}
	late := wire.JobObservation{JobView: wire.JobView{JobIdentity: wire.JobIdentity{ID: "default/late", Job: "late", Workers: 1}, JobDecision: wire.JobDecision{State: "waiting", Position: -1}}, Pending: wire.PendingHeld}
	o := wire.Observation{Time: now, Leader: true,
		Plan: wire.PlanView{Policy: "hadar", Placement: "delay", Round: 3, Time: now.Add(-time.Second), NextRound: now.Add(time.Minute),
			Refused: []wire.RefusedJob{{Job: "default/bad", Error: `meta hadar.steps = "lots": want a positive integer`}}},
		Jobs: []wire.JobObservation{a, b, c, late},
		Nodes: []wire.NodeObservation{
			{ID: "n1", Name: "v100-a", Rack: "r1", Status: "ready", Schedulable: true, Planned: true,
				GPUs: []wire.GPUObservation{{Type: "v100", Models: []string{"Tesla V100-SXM2-16GB"}, Total: 4, Healthy: 4,
					Holders: []wire.Holder{{Job: "default/a", Count: 2, Managed: true}, {Job: "default/plain", Count: 1}}}}},
			{ID: "n2", Name: "k80-a", Rack: "r2", Status: "ready", Schedulable: true, Planned: true,
				GPUs: []wire.GPUObservation{{Type: "k80", Models: []string{"Tesla K80"}, Total: 4, Healthy: 3}}},
		}}
	for _, j := range o.Jobs {
		o.Plan.Jobs = append(o.Plan.Jobs, j.JobView)
	}
	hist := []wire.Event{
		{Time: now.Add(-time.Hour), Job: "default/a", Action: wire.ActionStart, To: []wire.Unit{{Slots: []wire.Slot{{Node: "n2", Type: "k80", Count: 2}}}}, Why: "its turn"},
		{Time: now.Add(-time.Minute), Job: "default/a", Action: wire.ActionMove, To: []wire.Unit{{Slots: []wire.Slot{{Node: "n1", Type: "v100", Count: 2}}}}, Why: "faster on v100"},
		{Time: now.Add(-30 * time.Second), Job: "default/done", Action: wire.ActionStart, To: []wire.Unit{{Slots: []wire.Slot{{Node: "n1", Type: "v100", Count: 1}}}}},
		{Time: now.Add(-10 * time.Second), Job: "default/done", Result: "complete"},
	}
	return &fake{obs: o, hist: hist}
}

func get(t *testing.T, h http.Handler, path string) (int, http.Header, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Header(), rec.Body.String()
}

func TestStatusEndpoint(t *testing.T) {
	h := New(scenario(), Options{Secrets: []string{token}}).Handler()
	code, _, body := get(t, h, "/v1/status")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/status: %d %s", code, body)
	}
	var st wire.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	// The queue in the plan's order (c before b), the job that arrived
	// after the plan last; positions from 1.
	var q []string
	for _, e := range st.Queue {
		q = append(q, e.ID+"="+e.Waits)
	}
	if got := strings.Join(q, " "); got != "team/c=no_capacity default/b=held default/late=held" {
		t.Errorf("queue %s", got)
	}
	if st.Queue[0].Position != 1 || st.Queue[2].Position != 3 || st.Queue[0].Nomad == "" || strings.Join(st.Queue[1].RunsOn, ",") != "k80,v100" {
		t.Errorf("queue entries %+v", st.Queue)
	}
	if len(st.Running) != 1 || st.Running[0].Progress != 0.25 || st.Running[0].ETA == nil || !st.Running[0].ETA.Equal(now.Add(150*time.Second)) {
		t.Errorf("running %+v", st.Running)
	}
	if len(st.Racks) != 2 || st.Racks[0].Rack != "r1" || st.Racks[0].Nodes[0].Name != "v100-a" {
		t.Errorf("racks %+v", st.Racks)
	}
	want := []wire.TypeSummary{{Type: "k80", GPUUse: wire.GPUUse{Total: 3, Idle: 3}}, {Type: "v100", GPUUse: wire.GPUUse{Total: 4, Allocated: 2, Unmanaged: 1, Idle: 1}}}
	if len(st.GPUs) != 2 || st.GPUs[0] != want[0] || st.GPUs[1] != want[1] {
		t.Errorf("GPUs %+v, want %+v", st.GPUs, want)
	}
	if !st.Sidecar.OK || !st.Sidecar.Leader || st.Sidecar.Policy != "hadar" || len(st.Decisions) != 4 || len(st.Refused) != 1 {
		t.Errorf("sidecar %+v, %d decisions, %d refused", st.Sidecar, len(st.Decisions), len(st.Refused))
	}
	// The token in c's reason is redacted.
	if strings.Contains(body, token) || !strings.Contains(body, "[redacted]") {
		t.Errorf("the secret is not redacted from /v1/status")
	}
}

func TestJobEndpoint(t *testing.T) {
	h := New(scenario(), Options{}).Handler()
	for _, c := range []struct {
		path, state string
		code        int
		check       func(wire.JobDetail) string
	}{
		{"/v1/jobs/default/a", "running", 200, func(d wire.JobDetail) string {
			if len(d.Placements) != 2 || d.Placements[1].Action != "move" || d.Placements[1].Units[0].Slots[0].Rack != "r1" || d.Placements[0].Units[0].Slots[0].Rack != "r2" {
				return "placements with racks, oldest first"
			}
			if d.ETA == nil || d.Progress != 0.25 || d.QueuePosition != 0 {
				return "ETA and progress, no queue position"
			}
			return ""
		}},
		{"/v1/jobs/b", "waiting", 200, func(d wire.JobDetail) string {
			if d.ID != "default/b" || d.Waits != "held" || d.QueuePosition != 2 || d.QueueLength != 3 || !strings.Contains(d.Why, "delay scheduling") {
				return "held, #2 of 3, with the planner's reason"
			}
			return ""
		}},
		{"/v1/jobs/done", "gone", 200, func(d wire.JobDetail) string {
			if d.ID != "default/done" || d.Job != nil || d.Why != "complete" || len(d.Placements) != 1 || len(d.Decisions) != 2 {
				return "a finished job's history"
			}
			return ""
		}},
		{"/v1/jobs/default/bad", "refused", 200, func(d wire.JobDetail) string {
			if !strings.Contains(d.Why, "hadar.steps") {
				return "the refusal"
			}
			return ""
		}},
		{"/v1/jobs/nope", "", 404, nil},
	} {
		code, _, body := get(t, h, c.path)
		if code != c.code {
			t.Errorf("%s: %d %s", c.path, code, body)
			continue
		}
		if c.check == nil {
			continue
		}
		var d wire.JobDetail
		if err := json.Unmarshal([]byte(body), &d); err != nil {
			t.Fatal(err)
		}
		if d.State != c.state {
			t.Errorf("%s: state %q, want %q", c.path, d.State, c.state)
		}
		if msg := c.check(d); msg != "" {
			t.Errorf("%s: want %s; got %s", c.path, msg, body)
		}
	}
}

func TestPageAndMetrics(t *testing.T) {
	src := scenario()
	tel, err := telemetry.New(src, telemetry.Options{Policy: "hadar"})
	if err != nil {
		t.Fatal(err)
	}
	tel.Sample()
	h := New(src, Options{Telemetry: tel}).Handler()
	code, hdr, body := get(t, h, "/")
	if code != 200 || !strings.Contains(body, `<script src="/ui/app.js"`) || !strings.Contains(hdr.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Fatalf("GET /: %d %v %.200s", code, hdr, body)
	}
	if strings.Contains(body, "http://") || strings.Contains(body, "https://") {
		t.Errorf("the page refers to another site")
	}
	for _, f := range []string{"/ui/app.js", "/ui/style.css"} {
		code, _, body := get(t, h, f)
		if code != 200 || len(body) < 500 {
			t.Errorf("GET %s: %d, %d bytes", f, code, len(body))
		}
		if strings.Contains(body, "https://") || strings.Contains(body, "http://") && !strings.Contains(body, "http://www.w3.org/2000/svg") {
			t.Errorf("%s refers to another site", f)
		}
	}
	code, _, body = get(t, h, "/metrics")
	if code != 200 || !strings.Contains(body, `hadar_pending_jobs{policy="hadar",status="held"} 2`) || !strings.Contains(body, "# HELP hadar_pending_jobs Managed jobs waiting") {
		t.Errorf("GET /metrics: %d\n%s", code, body)
	}
	if code, _, _ := get(t, New(src, Options{}).Handler(), "/metrics"); code != 404 {
		t.Errorf("/metrics without telemetry: %d", code)
	}
	if code, _, _ := get(t, h, "/nope"); code != 404 {
		t.Errorf("GET /nope: %d", code)
	}
}

func TestListenerSecurity(t *testing.T) {
	for _, c := range []struct {
		l       Listener
		wantErr string
	}{
		{Listener{Address: "127.0.0.1:4650"}, ""},
		{Listener{Address: "localhost:4650"}, ""},
		{Listener{Address: "[::1]:4650"}, ""},
		{Listener{Address: "0.0.0.0:4650"}, "listens beyond this machine"},
		{Listener{Address: ":4650"}, "listens beyond this machine"},
		{Listener{Address: "10.0.0.5:4650"}, "allow_insecure_http"},
		{Listener{Address: "status.example.com:4650"}, "tls_cert"},
		{Listener{Address: "0.0.0.0:4650", AllowInsecure: true}, ""},
		{Listener{Address: "0.0.0.0:4650", CertFile: "c.pem", KeyFile: "k.pem"}, ""},
		{Listener{Address: "0.0.0.0:4650", CertFile: "c.pem"}, "both"},
		{Listener{Address: "4650"}, "want host:port"},
	} {
		err := c.l.Check()
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%+v: %v", c.l, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%+v: error %v, want one saying %q", c.l, err, c.wantErr)
		}
		if err != nil && strings.Contains(c.wantErr, "beyond") && !errors.Is(err, ErrInsecure) {
			t.Errorf("%+v: %v is not ErrInsecure", c.l, err)
		}
	}
	// Listen refuses before opening anything.
	if _, err := (Listener{Address: "0.0.0.0:0"}).Listen(); !errors.Is(err, ErrInsecure) {
		t.Errorf("Listen on 0.0.0.0 without TLS: %v", err)
	}
	if _, err := (Listener{Address: "127.0.0.1:0", CertFile: "/nonexistent.pem", KeyFile: "/nonexistent-key.pem"}).Listen(); err == nil || !strings.Contains(err.Error(), "TLS certificate") {
		t.Errorf("a missing certificate: %v", err)
	}
}

// TLS: the API serves HTTPS with the configured certificate, on any
// address, and plain HTTP to it fails.
func TestListenerServesTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	srv := New(scenario(), Options{})
	ctx := t.Context()
	bound := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- srv.Serve(ctx, Listener{Address: "0.0.0.0:0", CertFile: certFile, KeyFile: keyFile}, func(a net.Addr) { bound <- a })
	}()
	var addr net.Addr
	select {
	case addr = <-bound:
	case err := <-done:
		t.Fatal(err)
	}
	port := addr.(*net.TCPAddr).Port
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	resp, err := client.Get("https://127.0.0.1:" + strconv.Itoa(port) + "/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"replica": "r-1"`) {
		t.Fatalf("https health: %d %s", resp.StatusCode, b)
	}
	if resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/v1/health"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP got an answer from the TLS listener")
		}
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns
// a pool that trusts it.
func selfSigned(t *testing.T, dir string) (string, string, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hadar test"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// replicaSource is a source whose health is a given replica's.
type replicaSource struct {
	*fake
	h wire.Health
}

func (r replicaSource) Health() wire.Health { return r.h }

// /v1/leader is the check only the acting replica passes, served without
// a token as /v1/health is (Nomad's checks carry none): 200 on the leader
// whether or not it has planned yet, 503 on a follower, healthy or not.
func TestLeaderEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    wire.Health
		code int
	}{
		{"leader", wire.Health{OK: true, Leader: true, Replica: "a", Generation: 7}, http.StatusOK},
		{"leader before its first round", wire.Health{Leader: true, Replica: "a", Problem: "no round planned yet"}, http.StatusOK},
		{"healthy follower", wire.Health{OK: true, Replica: "b"}, http.StatusServiceUnavailable},
		{"follower not synced", wire.Health{Replica: "b", Problem: "not yet synced with Nomad"}, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := New(replicaSource{scenario(), tc.h}, Options{Auth: Auth{Token: token}}).Handler()
			code, _, body := get(t, h, "/v1/leader")
			if code != tc.code {
				t.Fatalf("GET /v1/leader: %d, want %d: %s", code, tc.code, body)
			}
			var got wire.Health
			if err := json.Unmarshal([]byte(body), &got); err != nil || got.Leader != tc.h.Leader || got.Replica != tc.h.Replica {
				t.Fatalf("body %s (%v)", body, err)
			}
			// The rest of the API still asks for a token.
			if code, _, _ := get(t, h, "/v1/status"); code != http.StatusUnauthorized {
				t.Fatalf("GET /v1/status without a token: %d", code)
			}
		})
	}
}
