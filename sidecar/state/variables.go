package state

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/hashicorp/nomad/api"
)

// Variables keeps the state in Nomad Variables, for a sidecar with no
// local disk. A Nomad variable holds at most 64 KiB, so the saved state is
// gzip'd and split into chunks under <prefix>/state/<generation>/<i>,
// written first; then the manifest <prefix>/manifest (check-and-set) is
// switched to the new generation; then the old chunks are deleted. A crash
// at any point leaves a manifest that names complete chunks. The journal
// lives in segments of SegmentSize entries, <prefix>/journal/<n>, with its
// head in <prefix>/journal/head.
type Variables struct {
	vars   *api.Variables
	ns     string
	prefix string
	mu     sync.Mutex
}

// Sizes of the Variables store.
const (
	ChunkBytes  = 40 << 10 // base64 of a chunk stays under 64 KiB
	SegmentSize = 64
)

// NewVariables returns a store under prefix (e.g. "hadar/sidecar") in
// namespace ns of the Nomad cluster client talks to. The token needs
// variable read and write there (docs/sidecar.md, "Least privilege").
func NewVariables(client *api.Client, ns, prefix string) *Variables {
	if ns == "" {
		ns = api.DefaultNamespace
	}
	return &Variables{vars: client.Variables(), ns: ns, prefix: prefix}
}

// Where implements Store.
func (v *Variables) Where() string {
	return fmt.Sprintf("Nomad variables %s/* in namespace %s", v.prefix, v.ns)
}

// Close implements Store.
func (v *Variables) Close() error { return nil }

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

type manifest struct {
	header
	Generation uint64 `json:"generation"`
	Chunks     int    `json:"chunks"`
}

// Load implements Store.
func (v *Variables) Load(ctx context.Context) (*Saved, error) {
	m, _, err := v.manifest(ctx)
	if err != nil || m == nil {
		return nil, err
	}
	var gz []byte
	for i := range m.Chunks {
		path := fmt.Sprintf("%s/state/%d/%d", v.prefix, m.Generation, i)
		c, err := v.peek(ctx, path)
		if err != nil {
			return nil, err
		}
		if c == nil {
			return nil, unreadable(v.Where(), fmt.Errorf("chunk %s is missing", path))
		}
		b, err := base64.StdEncoding.DecodeString(c.Items["data"])
		if err != nil {
			return nil, unreadable(v.Where(), fmt.Errorf("chunk %s: %v", path, err))
		}
		gz = append(gz, b...)
	}
	raw, err := gunzip(gz)
	if err != nil {
		return nil, unreadable(v.Where(), err)
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
	var m manifest
	if err := json.Unmarshal([]byte(mv.Items["manifest"]), &m); err != nil {
		return nil, nil, unreadable(v.Where(), fmt.Errorf("manifest: %v", err))
	}
	if err := checkHeader(v.Where(), m.header); err != nil {
		return nil, nil, err
	}
	return &m, mv, nil
}

// Save implements Store.
func (v *Variables) Save(ctx context.Context, s *Saved) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	raw, err := json.Marshal(s)
	if err != nil {
		return err
	}
	gz, err := gzipBytes(raw)
	if err != nil {
		return err
	}
	old, mv, err := v.manifest(ctx)
	if err != nil {
		return err
	}
	next := manifest{header: header{Format: Format, Version: Version}, Generation: 1}
	if old != nil {
		next.Generation = old.Generation + 1
	}
	for off := 0; off < len(gz); off += ChunkBytes {
		end := min(off+ChunkBytes, len(gz))
		path := fmt.Sprintf("%s/state/%d/%d", v.prefix, next.Generation, next.Chunks)
		if _, _, err := v.vars.Update(&api.Variable{Namespace: v.ns, Path: path, Items: api.VariableItems{"data": base64.StdEncoding.EncodeToString(gz[off:end])}}, v.wo(ctx)); err != nil {
			return fmt.Errorf("state in %s: write %s: %w", v.Where(), path, err)
		}
		next.Chunks++
	}
	mraw, _ := json.Marshal(next)
	nv := &api.Variable{Namespace: v.ns, Path: v.prefix + "/manifest", Items: api.VariableItems{"manifest": string(mraw)}}
	if mv != nil {
		nv.ModifyIndex = mv.ModifyIndex
	}
	if _, _, err := v.vars.CheckedUpdate(nv, v.wo(ctx)); err != nil {
		return fmt.Errorf("state in %s: switch the manifest to generation %d: %w", v.Where(), next.Generation, err)
	}
	if old != nil {
		for i := range old.Chunks {
			v.vars.Delete(fmt.Sprintf("%s/state/%d/%d", v.prefix, old.Generation, i), v.wo(ctx))
		}
	}
	return nil
}

type journalHead struct {
	Seq uint64 `json:"seq"`
}

// Append implements Store.
func (v *Variables) Append(ctx context.Context, e Entry) (uint64, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	hv, err := v.peek(ctx, v.prefix+"/journal/head")
	if err != nil {
		return 0, err
	}
	var head journalHead
	if hv != nil {
		if head.Seq, err = strconv.ParseUint(hv.Items["seq"], 10, 64); err != nil {
			return 0, unreadable(v.Where(), fmt.Errorf("journal head: %v", err))
		}
	}
	e.Seq = head.Seq + 1
	seg := (e.Seq - 1) / SegmentSize
	entries, sv, err := v.segment(ctx, seg)
	if err != nil {
		return 0, err
	}
	entries = append(entries, e)
	raw, _ := json.Marshal(entries)
	gz, err := gzipBytes(raw)
	if err != nil {
		return 0, err
	}
	segVar := &api.Variable{Namespace: v.ns, Path: fmt.Sprintf("%s/journal/%d", v.prefix, seg), Items: api.VariableItems{"entries": base64.StdEncoding.EncodeToString(gz)}}
	if sv != nil {
		segVar.ModifyIndex = sv.ModifyIndex
	}
	if _, _, err := v.vars.CheckedUpdate(segVar, v.wo(ctx)); err != nil {
		return 0, fmt.Errorf("state in %s: journal segment %d: %w", v.Where(), seg, err)
	}
	nh := &api.Variable{Namespace: v.ns, Path: v.prefix + "/journal/head", Items: api.VariableItems{"seq": strconv.FormatUint(e.Seq, 10)}}
	if hv != nil {
		nh.ModifyIndex = hv.ModifyIndex
	}
	if _, _, err := v.vars.CheckedUpdate(nh, v.wo(ctx)); err != nil {
		return 0, fmt.Errorf("state in %s: journal head: %w", v.Where(), err)
	}
	if old := int64(seg) - MaxJournal/SegmentSize; old >= 0 {
		v.vars.Delete(fmt.Sprintf("%s/journal/%d", v.prefix, old), v.wo(ctx))
	}
	return e.Seq, nil
}

func (v *Variables) segment(ctx context.Context, seg uint64) ([]Entry, *api.Variable, error) {
	sv, err := v.peek(ctx, fmt.Sprintf("%s/journal/%d", v.prefix, seg))
	if err != nil || sv == nil {
		return nil, nil, err
	}
	b, err := base64.StdEncoding.DecodeString(sv.Items["entries"])
	if err != nil {
		return nil, nil, unreadable(v.Where(), fmt.Errorf("journal segment %d: %v", seg, err))
	}
	raw, err := gunzip(b)
	if err != nil {
		return nil, nil, unreadable(v.Where(), fmt.Errorf("journal segment %d: %v", seg, err))
	}
	var out []Entry
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, nil, unreadable(v.Where(), fmt.Errorf("journal segment %d: %v", seg, err))
	}
	return out, sv, nil
}

// Journal implements Store.
func (v *Variables) Journal(ctx context.Context, after uint64) ([]Entry, error) {
	hv, err := v.peek(ctx, v.prefix+"/journal/head")
	if err != nil || hv == nil {
		return nil, err
	}
	last, err := strconv.ParseUint(hv.Items["seq"], 10, 64)
	if err != nil {
		return nil, unreadable(v.Where(), fmt.Errorf("journal head: %v", err))
	}
	var out []Entry
	for seg := after / SegmentSize; seg <= (last-1)/SegmentSize && last > 0; seg++ {
		es, _, err := v.segment(ctx, seg)
		if err != nil {
			return nil, err
		}
		for _, e := range es {
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
