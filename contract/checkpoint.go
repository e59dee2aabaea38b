package contract

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Checkpoints live in HADAR_CHECKPOINT_DIR, one file each, named
// ckpt-<step>.<ext>: <step> the writer's step count in decimal (the
// job's steps, or a HadarE copy's own), <ext> its format (json for the
// Go trainer, pt for the Python library). A checkpoint is written to a
// temporary file whose name starts with "." and renamed into place, so a
// name of this form is always a whole checkpoint. The newest is the one
// with the highest step; a process resumes from the newest it can read.
// What is inside is the writer's own business: only it reads them.

// CheckpointName is the file name of the checkpoint after step.
func CheckpointName(step int64, ext string) string {
	return fmt.Sprintf("ckpt-%d.%s", step, ext)
}

// ParseCheckpointName reads a checkpoint's file name; ok is false for any
// other name (temporary files, other files a job keeps there).
func ParseCheckpointName(name string) (step int64, ext string, ok bool) {
	rest, ok := strings.CutPrefix(name, "ckpt-")
	if !ok {
		return 0, "", false
	}
	num, ext, ok := strings.Cut(rest, ".")
	if !ok || num == "" || ext == "" || strings.ContainsAny(ext, "./") {
		return 0, "", false
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, "", false
		}
	}
	for _, c := range ext {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return 0, "", false
		}
	}
	step, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, "", false
	}
	return step, ext, true
}

// Checkpoints orders names: the checkpoints of format ext among them
// (every format if ext is empty), newest first; on equal steps, by name.
func Checkpoints(names []string, ext string) []string {
	type ck struct {
		step int64
		name string
	}
	var cks []ck
	for _, n := range names {
		step, e, ok := ParseCheckpointName(n)
		if ok && (ext == "" || e == ext) {
			cks = append(cks, ck{step, n})
		}
	}
	slices.SortFunc(cks, func(a, b ck) int {
		if c := cmp.Compare(b.step, a.step); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	out := make([]string, len(cks))
	for i, c := range cks {
		out[i] = c.name
	}
	return out
}
