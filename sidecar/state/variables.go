package state

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/nomad/api"
)

// Variables keeps the state in Nomad Variables, for a sidecar with no
// local disk, shared by the replicas of a leader election. Two of them may
// write at once (a deposed leader that has not noticed yet, and the new
// one), so nothing one writes can spoil what the other wrote:
//
// The saved state is gzip'd and split into chunks (a variable holds 64
// KiB) under <prefix>/state/<generation>-<writer>/<i>, a directory no other
// store writes (a fresh one for every save: see Save); then the manifest
// <prefix>/manifest is switched to them by
// check-and-set against the manifest read when the save began, recording
// the SHA-256 of the chunks and the lock generation of the save (the
// fence); only then are older generations' chunks deleted. A crash at any
// point leaves a manifest naming complete chunks; the loser of a race gets
// ErrConflict and removes its chunks; a reader that meets a save midway
// reads the manifest again.
//
// The journal lives in segments of up to SegmentSize entries,
// <prefix>/journal/<n>, each written by check-and-set: a segment write is
// the commit point of its entries, and a segment records the highest lock
// generation that appended (the fence). <prefix>/journal/head names the
// newest segment, a hint only: the tail is found by reading forward from
// it. Appends are written in batches, one request for all the entries
// waiting (docs/sidecar.md, "State and recovery").
type Variables struct {
	vars   *api.Variables
	ns     string
	prefix string
	// writer names this store's chunk directories: random, so two
	// replicas' saves never write the same variable.
	writer string
	// segSize and keep are SegmentSize and MaxJournal (tests shrink them).
	segSize int
	keep    int

	// saveMu makes this store's saves one at a time; saves counts them
	// (under saveMu) to give each its own chunk directory.
	saveMu sync.Mutex
	saves  uint64

	// life ends with Close: it stops the journal's writer.
	life context.Context
	stop context.CancelFunc

	jmu     sync.Mutex
	queue   []*appendReq
	started bool // the journal writer runs
	closed  bool
	wake    chan struct{}
	done    chan struct{} // closed when the journal writer returned
	// tail is the journal writer's copy of the last segment (only the
	// writer goroutine touches it).
	tail tail
}

// Sizes of the Variables store.
const (
	ChunkBytes  = 40 << 10 // base64 of a chunk stays under 64 KiB
	SegmentSize = 64
	// varLimit is what Nomad stores in one variable: keys and values of
	// its items, 64 KiB (nomad/structs/variables.go).
	varLimit = 64 << 10
	// loadAttempts bounds the re-reads of a Load that keeps meeting saves.
	loadAttempts = 8
	// appendConflicts bounds the check-and-set retries in a row of one
	// journal write racing another replica's appends.
	appendConflicts = 32
)

// NewVariables returns a store under prefix (e.g. "hadar/sidecar") in
// namespace ns of the Nomad cluster client talks to. The token needs
// variable read, write, list and destroy there (docs/sidecar.md, "Least
// privilege"). Close stops its journal writer.
func NewVariables(client *api.Client, ns, prefix string) *Variables {
	if ns == "" {
		ns = api.DefaultNamespace
	}
	var id [8]byte
	rand.Read(id[:]) // never fails (crypto/rand)
	life, stop := context.WithCancel(context.Background())
	return &Variables{vars: client.Variables(), ns: ns, prefix: strings.TrimSuffix(prefix, "/"), writer: hex.EncodeToString(id[:]),
		segSize: SegmentSize, keep: MaxJournal, life: life, stop: stop, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// Where implements Store.
func (v *Variables) Where() string {
	return fmt.Sprintf("Nomad variables %s/* in namespace %s", v.prefix, v.ns)
}

// Close implements Store: appends still queued fail, the one in flight is
// cancelled.
func (v *Variables) Close() error {
	v.jmu.Lock()
	if v.closed {
		v.jmu.Unlock()
		return nil
	}
	v.closed = true
	started := v.started
	v.jmu.Unlock()
	v.stop()
	if started {
		<-v.done
	}
	return nil
}

func (v *Variables) qo(ctx context.Context) *api.QueryOptions {
	return (&api.QueryOptions{Namespace: v.ns}).WithContext(ctx)
}

func (v *Variables) wo(ctx context.Context) *api.WriteOptions {
	return (&api.WriteOptions{Namespace: v.ns}).WithContext(ctx)
}

// peek reads a variable, nil when it does not exist.
func (v *Variables) peek(ctx context.Context, path string) (*api.Variable, error) {
	out, _, err := v.vars.Peek(path, v.qo(ctx))
	if err != nil {
		return nil, fmt.Errorf("state in %s: read %s: %w", v.Where(), path, err)
	}
	return out, nil
}

// list returns the paths of the variables under dir (with its trailing
// slash).
func (v *Variables) list(ctx context.Context, dir string) ([]string, error) {
	ms, _, err := v.vars.PrefixList(dir, v.qo(ctx))
	if err != nil {
		return nil, fmt.Errorf("state in %s: list %s: %w", v.Where(), dir, err)
	}
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Path)
	}
	return out, nil
}

// conflictOf returns the variable as Nomad holds it when err is a
// check-and-set conflict (nil items: there is none, or the token may not
// read it).
func conflictOf(err error) (*api.Variable, bool) {
	var c api.ErrCASConflict
	if errors.As(err, &c) {
		if c.Conflict == nil {
			return &api.Variable{}, true
		}
		return c.Conflict, true
	}
	return nil, false
}

type manifest struct {
	header
	// Generation counts saves; Writer is the store that wrote this one
	// and which of its saves: its chunks are
	// <prefix>/state/<Generation>-<Writer>/<i> (no Writer:
	// <prefix>/state/<Generation>/<i>, the layout before writers).
	Generation uint64 `json:"generation"`
	Writer     string `json:"writer,omitempty"`
	Chunks     int    `json:"chunks"`
	// SHA256 is the hex SHA-256 of the chunks' bytes, in order.
	SHA256 string `json:"sha256,omitempty"`
	// LockGeneration and Leader say who saved it: the fence.
	LockGeneration uint64 `json:"lock_generation,omitempty"`
	Leader         string `json:"leader,omitempty"`
}

func (v *Variables) chunkDir(m *manifest) string {
	if m.Writer == "" {
		return fmt.Sprintf("%s/state/%d", v.prefix, m.Generation)
	}
	return fmt.Sprintf("%s/state/%d-%s", v.prefix, m.Generation, m.Writer)
}

// errTorn marks a generation read while a save replaced it: a chunk gone,
// or chunks that do not add up to the checksum.
var errTorn = errors.New("torn")

// Load implements Store. A generation that changes under the read (a
// save switched the manifest and deleted the chunks being read) is read
// again from the new manifest; one the manifest still names after that
// is broken.
func (v *Variables) Load(ctx context.Context) (*Saved, error) {
	var prev uint64
	var why error
	for attempt := range loadAttempts {
		m, mv, err := v.manifest(ctx)
		if err != nil || m == nil {
			return nil, err
		}
		if attempt > 0 && mv.ModifyIndex == prev {
			return nil, unreadable(v.Where(), why)
		}
		prev = mv.ModifyIndex
		s, err := v.loadGeneration(ctx, m)
		if !errors.Is(err, errTorn) {
			return s, err
		}
		why = err
	}
	return nil, unreadable(v.Where(), fmt.Errorf("the state changed under %d reads in a row; last: %v", loadAttempts, why))
}

func (v *Variables) loadGeneration(ctx context.Context, m *manifest) (*Saved, error) {
	var gz []byte
	for i := range m.Chunks {
		path := fmt.Sprintf("%s/%d", v.chunkDir(m), i)
		c, err := v.peek(ctx, path)
		if err != nil {
			return nil, err
		}
		if c == nil {
			return nil, fmt.Errorf("%w: chunk %s of generation %d is missing", errTorn, path, m.Generation)
		}
		b, err := base64.StdEncoding.DecodeString(c.Items["data"])
		if err != nil {
			return nil, fmt.Errorf("%w: chunk %s: %v", errTorn, path, err)
		}
		gz = append(gz, b...)
	}
	if m.SHA256 != "" {
		if sum := sha256.Sum256(gz); hex.EncodeToString(sum[:]) != m.SHA256 {
			return nil, fmt.Errorf("%w: generation %d: the chunks' SHA-256 is %x, the manifest says %s (a chunk corrupt or replaced)", errTorn, m.Generation, sum, m.SHA256)
		}
	}
	raw, err := gunzip(gz)
	if err != nil {
		if m.SHA256 == "" {
			return nil, fmt.Errorf("%w: generation %d: %v", errTorn, m.Generation, err)
		}
		return nil, unreadable(v.Where(), fmt.Errorf("generation %d: %v", m.Generation, err))
	}
	var s Saved
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, unreadable(v.Where(), fmt.Errorf("saved state: %v", err))
	}
	return &s, nil
}

func (v *Variables) manifest(ctx context.Context) (*manifest, *api.Variable, error) {
	mv, err := v.peek(ctx, v.prefix+"/manifest")
	if err != nil || mv == nil {
		return nil, nil, err
	}
	m, err := v.decodeManifest(mv)
	if err != nil {
		return nil, nil, err
	}
	return m, mv, nil
}

func (v *Variables) decodeManifest(mv *api.Variable) (*manifest, error) {
	var m manifest
	if err := json.Unmarshal([]byte(mv.Items["manifest"]), &m); err != nil {
		return nil, unreadable(v.Where(), fmt.Errorf("manifest: %v", err))
	}
	if err := checkHeader(v.Where(), m.header); err != nil {
		return nil, err
	}
	return &m, nil
}

// Save implements Store. A save by a lock generation older than the
// saved state's is refused (ErrFenced); one that loses a race with
// another replica's is dropped (ErrConflict). Either way nothing of it
// stays.
func (v *Variables) Save(ctx context.Context, s *Saved) error {
	v.saveMu.Lock()
	defer v.saveMu.Unlock()
	raw, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("state in %s: %w", v.Where(), err)
	}
	gz, err := gzipBytes(raw)
	if err != nil {
		return fmt.Errorf("state in %s: %w", v.Where(), err)
	}
	old, mv, err := v.manifest(ctx)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(gz)
	// Every save writes its own directory, never one an earlier save of
	// this store may have switched the manifest to: a switch whose answer
	// was lost can still be applied by Nomad after the next save read the
	// manifest, and rewriting its chunks would leave a manifest that names
	// chunks not its own.
	// ("_": Nomad refuses "." in a variable's path.)
	v.saves++
	writer := v.writer + "_" + strconv.FormatUint(v.saves, 10)
	next := &manifest{header: header{Format: Format, Version: Version}, Generation: 1, Writer: writer,
		Chunks: (len(gz) + ChunkBytes - 1) / ChunkBytes, SHA256: hex.EncodeToString(sum[:]), LockGeneration: s.Generation, Leader: s.Leader}
	if old != nil {
		if err := fence(v.Where(), "save", s.Generation, old.LockGeneration, old.Leader); err != nil {
			return err
		}
		next.Generation = old.Generation + 1
	}
	dir := v.chunkDir(next)
	for i := range next.Chunks {
		data := gz[i*ChunkBytes : min((i+1)*ChunkBytes, len(gz))]
		path := fmt.Sprintf("%s/%d", dir, i)
		if _, _, err := v.vars.Update(&api.Variable{Namespace: v.ns, Path: path, Items: api.VariableItems{"data": base64.StdEncoding.EncodeToString(data)}}, v.wo(ctx)); err != nil {
			v.removeChunks(ctx, dir, i)
			return fmt.Errorf("state in %s: write %s: %w", v.Where(), path, err)
		}
	}
	mraw, err := json.Marshal(next)
	if err != nil {
		return fmt.Errorf("state in %s: %w", v.Where(), err)
	}
	nv := &api.Variable{Namespace: v.ns, Path: v.prefix + "/manifest", Items: api.VariableItems{"manifest": string(mraw)}}
	if mv != nil {
		nv.ModifyIndex = mv.ModifyIndex
	}
	if _, _, err := v.vars.CheckedUpdate(nv, v.wo(ctx)); err != nil {
		c, ok := conflictOf(err)
		if !ok {
			// The switch may have happened all the same (an answer lost):
			// the chunks stay, a later save deletes them if they are not
			// the state.
			return fmt.Errorf("state in %s: switch the manifest to generation %d: %w", v.Where(), next.Generation, err)
		}
		if !v.mayName(ctx, c, next) {
			v.removeChunks(ctx, dir, next.Chunks)
		}
		return v.lost(s, next.Generation, c)
	}
	v.sweep(ctx, next)
	return nil
}

// mayName reports whether the manifest, as the conflict c shows it (read
// again when c does not say), may name the chunks of m: then they are not
// deleted. Not knowing counts as yes: chunks left behind are swept by a
// later save, chunks deleted under the manifest make the state unreadable.
func (v *Variables) mayName(ctx context.Context, c *api.Variable, m *manifest) bool {
	cur, err := v.decodeManifest(c)
	if c.Items == nil || err != nil {
		var mv *api.Variable
		if cur, mv, err = v.manifest(ctx); err != nil {
			return true
		}
		if mv == nil {
			return false
		}
	}
	return v.chunkDir(cur) == v.chunkDir(m)
}

// lost is the error of a save whose manifest switch found c instead of
// the manifest it read: fenced when c was saved by a newer leader.
func (v *Variables) lost(s *Saved, gen uint64, c *api.Variable) error {
	by := "unknown"
	if m, err := v.decodeManifest(c); err == nil && c.Items != nil {
		if err := fence(v.Where(), "save", s.Generation, m.LockGeneration, m.Leader); err != nil {
			return err
		}
		by = fmt.Sprintf("generation %d, by replica %q of lock generation %d", m.Generation, m.Leader, m.LockGeneration)
	}
	return fmt.Errorf("%w: %s: save of generation %d dropped: the manifest changed since it was read (%s); the next save starts from it", ErrConflict, v.Where(), gen, by)
}

// removeChunks deletes the first n chunks of a save that did not become
// the state. Best effort: what stays is swept by the next save.
func (v *Variables) removeChunks(ctx context.Context, dir string, n int) {
	for i := range n {
		v.vars.Delete(fmt.Sprintf("%s/%d", dir, i), v.wo(ctx))
	}
}

// sweep deletes, after m became the state, the chunks of every other
// generation up to m's: older states, and the leftovers of writers that
// crashed or lost a race. Chunks of newer generations belong to saves that
// started after the switch and are left alone. Best effort: what stays is
// swept by the next save.
func (v *Variables) sweep(ctx context.Context, m *manifest) {
	dir := v.prefix + "/state/"
	paths, err := v.list(ctx, dir)
	if err != nil {
		return
	}
	for _, p := range paths {
		name, _, ok := strings.Cut(strings.TrimPrefix(p, dir), "/")
		if !ok {
			continue
		}
		genText, writer, _ := strings.Cut(name, "-")
		gen, err := strconv.ParseUint(genText, 10, 64)
		if err != nil || gen > m.Generation || (gen == m.Generation && writer == m.Writer) {
			continue
		}
		v.vars.Delete(p, v.wo(ctx))
	}
}

// tail is the last segment of the journal as the journal writer last
// wrote or read it.
type tail struct {
	known bool
	seg   uint64
	// index is the segment variable's ModifyIndex; 0 when it does not
	// exist yet.
	index   uint64
	entries []Entry
	// sealed: no entry goes into it any more (it was as large as a
	// variable holds before it had SegmentSize entries).
	sealed bool
	// fence is the highest lock generation that appended, up to this
	// segment, and fenceBy the replica that did; last is the last
	// sequence number, in this segment or before it.
	fence   uint64
	fenceBy string
	last    uint64
}

// full reports whether the next entry goes into the next segment.
func (t *tail) full(size int) bool { return t.sealed || len(t.entries) >= size }

// next is the empty segment after a full t.
func (t tail) next() tail {
	return tail{known: true, seg: t.seg + 1, fence: t.fence, fenceBy: t.fenceBy, last: t.last}
}

type appendReq struct {
	ctx  context.Context
	e    Entry
	seq  uint64
	err  error
	done chan struct{}
}

func (r *appendReq) finish(seq uint64, err error) {
	r.seq, r.err = seq, err
	close(r.done)
}

// Append implements Store. The entry joins those waiting for the journal
// writer, which writes all of them in one request: under load (a round's
// writes go out 48 at a time) one request journals many entries. An entry
// of a lock generation older than one already journaled is refused
// (ErrFenced). An Append whose ctx ends before the answer returns an
// error, yet its entry may have been journaled (as with any remote write
// whose answer is lost).
func (v *Variables) Append(ctx context.Context, e Entry) (uint64, error) {
	r := &appendReq{ctx: ctx, e: e, done: make(chan struct{})}
	v.jmu.Lock()
	if v.closed {
		v.jmu.Unlock()
		return 0, fmt.Errorf("state in %s: journal: the store is closed", v.Where())
	}
	v.queue = append(v.queue, r)
	if !v.started {
		v.started = true
		go v.journalWriter()
	}
	v.jmu.Unlock()
	select {
	case v.wake <- struct{}{}:
	default:
	}
	select {
	case <-r.done:
		return r.seq, r.err
	case <-ctx.Done():
		return 0, fmt.Errorf("state in %s: journal: %w (the entry may have been journaled all the same)", v.Where(), ctx.Err())
	}
}

// journalWriter writes the waiting entries, a batch at a time, until the
// store is closed.
func (v *Variables) journalWriter() {
	defer close(v.done)
	for {
		v.jmu.Lock()
		batch := v.queue
		v.queue = nil
		v.jmu.Unlock()
		if len(batch) > 0 {
			v.appendBatch(batch)
			continue
		}
		select {
		case <-v.wake:
		case <-v.life.Done():
			v.jmu.Lock()
			batch, v.queue = v.queue, nil
			v.jmu.Unlock()
			for _, r := range batch {
				r.finish(0, fmt.Errorf("state in %s: journal: the store is closed", v.Where()))
			}
			return
		}
	}
}

// batchContext ends when every request of the batch has ended (one
// caller giving up does not fail the others' entries) or the store is
// closed.
func (v *Variables) batchContext(batch []*appendReq) (context.Context, func()) {
	ctx, cancel := context.WithCancel(v.life)
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, 0, len(batch))
	for _, r := range batch {
		stops = append(stops, context.AfterFunc(r.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// appendBatch journals the entries of batch, in order, in as few segment
// writes as they fit in. Each write is a check-and-set on the tail
// segment: one that finds the segment changed (another replica appended)
// takes the segment from Nomad's answer and tries again.
func (v *Variables) appendBatch(batch []*appendReq) {
	var pending []*appendReq
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.finish(0, fmt.Errorf("state in %s: journal: %w", v.Where(), err))
			continue
		}
		pending = append(pending, r)
	}
	if len(pending) == 0 {
		return
	}
	ctx, done := v.batchContext(pending)
	defer done()
	fail := func(rs []*appendReq, err error) {
		for _, r := range rs {
			r.finish(0, err)
		}
	}
	conflicts := 0
	for len(pending) > 0 {
		if !v.tail.known {
			t, err := v.locate(ctx)
			if err != nil {
				fail(pending, err)
				return
			}
			v.tail = t
		}
		t := v.tail
		if t.full(v.segSize) {
			t = t.next()
		}
		t, took, rest, items := v.fill(t, pending)
		if items == nil {
			pending = rest // refused, every one
			continue
		}
		path := fmt.Sprintf("%s/journal/%d", v.prefix, t.seg)
		out, _, err := v.vars.CheckedUpdate(&api.Variable{Namespace: v.ns, Path: path, Items: items, ModifyIndex: t.index}, v.wo(ctx))
		if c, ok := conflictOf(err); ok {
			if conflicts++; conflicts > appendConflicts {
				v.tail.known = false
				fail(slices.Concat(took, rest), fmt.Errorf("%w: state in %s: journal segment %s: %d check-and-set conflicts in a row (another replica keeps appending): %w", ErrConflict, v.Where(), path, conflicts-1, err))
				return
			}
			v.tail = v.fromConflict(t.seg, c)
			pending = slices.Concat(took, rest)
			continue
		}
		if err != nil {
			v.tail.known = false // it may have been written all the same: read it back
			fail(slices.Concat(took, rest), fmt.Errorf("state in %s: journal segment %s: %w", v.Where(), path, err))
			return
		}
		conflicts = 0 // the bound is on races in a row: a long batch meets some at each write
		created := t.index == 0
		t.index = out.ModifyIndex
		t.known = t.index != 0 // Nomad answers no index for a write that changed nothing
		v.tail = t
		for i, r := range took {
			r.finish(t.entries[len(t.entries)-len(took)+i].Seq, nil)
		}
		pending = rest
		if created {
			v.newSegment(ctx, t.seg)
		}
	}
}

// fill appends to t the entries of pending that the segment takes, in
// order, and returns it with its items (nil: nothing to write), the
// requests it took and those left; it answers the others. An entry of a
// lock generation older than the fence is refused at once: the fence only
// grows, so a stale t refuses nothing wrongly. Entries that would make the
// segment larger than a variable holds are left for the next segment, and
// the segment is sealed (an entry too large on its own is refused).
func (v *Variables) fill(t tail, pending []*appendReq) (tail, []*appendReq, []*appendReq, api.VariableItems) {
	var cand []*appendReq
	fenceAt, by, i := t.fence, t.fenceBy, 0
	for ; i < len(pending) && len(t.entries)+len(cand) < v.segSize; i++ {
		r := pending[i]
		if err := fence(v.Where(), "journal entry", r.e.Generation, fenceAt, by); err != nil {
			r.finish(0, err)
			continue
		}
		if r.e.Generation > fenceAt {
			fenceAt, by = r.e.Generation, r.e.Leader
		}
		cand = append(cand, r)
	}
	rest := pending[i:]
	if len(cand) == 0 {
		return t, nil, rest, nil
	}
	failed := func(err error) (tail, []*appendReq, []*appendReq, api.VariableItems) {
		for _, r := range slices.Concat(cand, rest) {
			r.finish(0, err)
		}
		return t, nil, nil, nil
	}
	for n := len(cand); n > 0; n /= 2 {
		nt := t
		nt.entries = slices.Clone(t.entries)
		for _, r := range cand[:n] {
			nt.last++
			e := r.e
			e.Seq = nt.last
			nt.entries = append(nt.entries, e)
			if e.Generation > nt.fence {
				nt.fence, nt.fenceBy = e.Generation, e.Leader
			}
		}
		nt.sealed = n < len(cand)
		items, err := v.segmentItems(nt)
		if err != nil {
			return failed(err)
		}
		// The slack leaves room to seal the segment later.
		if itemsSize(items) <= varLimit-64 {
			return nt, cand[:n], slices.Concat(cand[n:], rest), items
		}
	}
	if len(t.entries) == 0 {
		r := cand[0]
		r.finish(0, fmt.Errorf("state in %s: journal entry for job %q: larger than a Nomad variable holds (%d bytes) on its own", v.Where(), r.e.Job, varLimit))
		return t, nil, slices.Concat(cand[1:], rest), nil
	}
	// Not one more entry fits: seal the segment as it is; they go to the
	// next one.
	t.sealed = true
	items, err := v.segmentItems(t)
	if err != nil {
		return failed(err)
	}
	return t, nil, slices.Concat(cand, rest), items
}

func itemsSize(items api.VariableItems) int {
	n := 0
	for k, v := range items {
		n += len(k) + len(v)
	}
	return n
}

func (v *Variables) segmentItems(t tail) (api.VariableItems, error) {
	raw, err := json.Marshal(t.entries)
	if err != nil {
		return nil, fmt.Errorf("state in %s: journal segment %d: %w", v.Where(), t.seg, err)
	}
	gz, err := gzipBytes(raw)
	if err != nil {
		return nil, fmt.Errorf("state in %s: journal segment %d: %w", v.Where(), t.seg, err)
	}
	items := api.VariableItems{"entries": base64.StdEncoding.EncodeToString(gz), "generation": strconv.FormatUint(t.fence, 10)}
	if t.fenceBy != "" {
		items["leader"] = t.fenceBy
	}
	if t.sealed {
		items["sealed"] = "true"
	}
	return items, nil
}

// decodeSegment reads segment seg from its variable.
func (v *Variables) decodeSegment(seg uint64, sv *api.Variable) (tail, error) {
	bad := func(err error) (tail, error) {
		return tail{}, unreadable(v.Where(), fmt.Errorf("journal segment %d: %v", seg, err))
	}
	b, err := base64.StdEncoding.DecodeString(sv.Items["entries"])
	if err != nil {
		return bad(err)
	}
	raw, err := gunzip(b)
	if err != nil {
		return bad(err)
	}
	t := tail{known: true, seg: seg, index: sv.ModifyIndex, sealed: sv.Items["sealed"] == "true", fenceBy: sv.Items["leader"]}
	if err := json.Unmarshal(raw, &t.entries); err != nil {
		return bad(err)
	}
	if g, ok := sv.Items["generation"]; ok {
		if t.fence, err = strconv.ParseUint(g, 10, 64); err != nil {
			return bad(fmt.Errorf("generation: %v", err))
		}
	}
	for _, e := range t.entries {
		t.last = max(t.last, e.Seq)
		if e.Generation > t.fence { // segments written before the fence was recorded
			t.fence, t.fenceBy = e.Generation, e.Leader
		}
	}
	return t, nil
}

// fromConflict is the tail segment seg as a check-and-set conflict shows
// it; unknown (to be read again) when the answer holds no segment.
func (v *Variables) fromConflict(seg uint64, c *api.Variable) tail {
	if c.Items["entries"] == "" || c.ModifyIndex == 0 {
		return tail{}
	}
	t, err := v.decodeSegment(seg, c)
	if err != nil {
		return tail{}
	}
	return t
}

// segment reads journal segment seg; ok false when it does not exist.
func (v *Variables) segment(ctx context.Context, seg uint64) (t tail, ok bool, err error) {
	sv, err := v.peek(ctx, fmt.Sprintf("%s/journal/%d", v.prefix, seg))
	if err != nil || sv == nil {
		return tail{}, false, err
	}
	t, err = v.decodeSegment(seg, sv)
	return t, err == nil, err
}

// head reads the hint: the newest segment when it was written last.
func (v *Variables) head(ctx context.Context) (uint64, error) {
	hv, err := v.peek(ctx, v.prefix+"/journal/head")
	if err != nil || hv == nil {
		return 0, err
	}
	if s, ok := hv.Items["segment"]; ok {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, unreadable(v.Where(), fmt.Errorf("journal head: %v", err))
		}
		return n, nil
	}
	// The first layout kept the last sequence number, in segments of 64.
	seq, err := strconv.ParseUint(hv.Items["seq"], 10, 64)
	if err != nil {
		return 0, unreadable(v.Where(), fmt.Errorf("journal head: %v", err))
	}
	return (max(seq, 1) - 1) / 64, nil
}

// segments lists the journal's segment numbers, ascending.
func (v *Variables) segments(ctx context.Context) ([]uint64, error) {
	dir := v.prefix + "/journal/"
	paths, err := v.list(ctx, dir)
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, p := range paths {
		if n, err := strconv.ParseUint(strings.TrimPrefix(p, dir), 10, 64); err == nil {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// locate finds the true tail of the journal: from the head's segment
// forward while a segment is full and the next one exists (a writer that
// died between its segment write and the head's left the head behind).
// When the head's segment is gone (a head left far behind, past trimming)
// the newest segment listed is the start.
func (v *Variables) locate(ctx context.Context) (tail, error) {
	hint, err := v.head(ctx)
	if err != nil {
		return tail{}, err
	}
	t, ok, err := v.segment(ctx, hint)
	if err != nil {
		return tail{}, err
	}
	if !ok {
		segs, err := v.segments(ctx)
		if err != nil {
			return tail{}, err
		}
		if len(segs) == 0 || segs[len(segs)-1] < hint {
			return tail{known: true, seg: hint}, nil // an empty journal
		}
		if t, ok, err = v.segment(ctx, segs[len(segs)-1]); err != nil {
			return tail{}, err
		} else if !ok {
			return tail{}, fmt.Errorf("state in %s: journal segment %d went while being read (trimmed?): try again", v.Where(), segs[len(segs)-1])
		}
	}
	for t.full(v.segSize) {
		n, ok, err := v.segment(ctx, t.seg+1)
		if err != nil {
			return tail{}, err
		}
		if !ok {
			break
		}
		n.last = max(n.last, t.last)
		n.fence = max(n.fence, t.fence)
		t = n
	}
	return t, nil
}

// newSegment moves the head hint to seg, just created, and deletes the
// segments that fell out of the MaxJournal entries kept. Best effort: a
// head not written leaves the next reader one more segment to read
// forward, a segment not deleted goes with the next new one.
func (v *Variables) newSegment(ctx context.Context, seg uint64) {
	h := &api.Variable{Namespace: v.ns, Path: v.prefix + "/journal/head", Items: api.VariableItems{"segment": strconv.FormatUint(seg, 10)}}
	if _, _, err := v.vars.Update(h, v.wo(ctx)); err != nil {
		return
	}
	keep := uint64((v.keep + v.segSize - 1) / v.segSize)
	if seg <= keep {
		return
	}
	segs, err := v.segments(ctx)
	if err != nil {
		return
	}
	for _, n := range segs {
		if n < seg-keep {
			v.vars.Delete(fmt.Sprintf("%s/journal/%d", v.prefix, n), v.wo(ctx))
		}
	}
}

// Journal implements Store: from the tail back to the segment holding
// the entry after after (or the oldest kept).
func (v *Variables) Journal(ctx context.Context, after uint64) ([]Entry, error) {
	t, err := v.locate(ctx)
	if err != nil {
		return nil, err
	}
	var segs [][]Entry
	for {
		segs = append(segs, t.entries)
		if len(t.entries) == 0 || t.entries[0].Seq <= after+1 || t.seg == 0 {
			break
		}
		prev, ok, err := v.segment(ctx, t.seg-1)
		if err != nil {
			return nil, err
		}
		if !ok {
			break // trimmed
		}
		t = prev
	}
	var out []Entry
	for i := len(segs) - 1; i >= 0; i-- {
		for _, e := range segs[i] {
			if e.Seq > after {
				out = append(out, e)
			}
		}
	}
	return out, nil
}

func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func gunzip(b []byte) ([]byte, error) {
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("gzip: %v", err)
	}
	out, err := io.ReadAll(io.LimitReader(r, 1<<30))
	if err != nil {
		return nil, fmt.Errorf("gzip: %v", err)
	}
	return out, nil
}
