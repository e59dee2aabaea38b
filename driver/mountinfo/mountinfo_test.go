package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"/sys/fs/cgroup", "/sys/fs/cgroup"},
		{`/mnt/my\040disk`, "/mnt/my disk"},
		{`/a\011b`, "/a\tb"},
		{`/a\012b`, "/a\nb"},
		{`/a\134b`, `/a\b`},
		{`\040\040`, "  "},
		{`/end\040`, "/end "},
		// An escaped backslash is not read again as the start of one.
		{`/a\134040`, `/a\040`},
		// Malformed sequences are left as they are.
		{`/a\04`, `/a\04`},
		{`/a\0`, `/a\0`},
		{`/a\`, `/a\`},
		{`/a\08x`, `/a\08x`},
		{`/a\xyz`, `/a\xyz`},
		{`/a\400`, `/a\400`},
		{`/a\+12`, `/a\+12`},
		{`/a\-12`, `/a\-12`},
		{`/a\\040`, `/a\ `},
	} {
		if got := Unescape(tc.in); got != tc.want {
			t.Errorf("Unescape(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
