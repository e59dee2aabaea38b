// Package mountinfo reads what /proc/self/mountinfo spells in its own way:
// the kernel escapes a space, a tab, a newline and a backslash in a mount
// point or source as three octal digits (\040, \011, \012, \134). The
// task driver's cgroup code and the demo's and harness's host paths
// (internal/hostpath) both read mount points, and share this one
// definition (issue 34). A leaf: it imports nothing of hadar, so the
// plugins and the tools alike may import it.
package mountinfo

import (
	"strconv"
	"strings"
)

// Unescape undoes mountinfo's octal escapes: a backslash and three octal
// digits of a byte's value (\040 for a space). A backslash not followed
// by one (too few digits, a digit past 7, a value past \377) is left as
// it is, as is everything else.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
