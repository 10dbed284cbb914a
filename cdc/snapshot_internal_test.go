package cdc

import "testing"

// A new logical slot's snapshot can come out with xmin above xmax
// ("31075:31063:", seen under load), which pg_snapshot's input refuses.
func TestNormalizeSnapshot(t *testing.T) {
	for in, want := range map[string]string{
		"31075:31063:":    "31075:31075:",
		"100:105:101,103": "100:105:101,103",
		"1041:1041:":      "1041:1041:",
		"garbage":         "garbage",
		"5:x:":            "5:x:",
	} {
		if got := normalizeSnapshot(in); got != want {
			t.Errorf("normalizeSnapshot(%q) = %q, want %q", in, got, want)
		}
	}
}
