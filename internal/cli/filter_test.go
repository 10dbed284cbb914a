package cli

import (
	"flag"
	"io"
	"testing"
	"time"
)

// TestEventFlagsFilter: --key picks its value even when empty and no key
// without it; --since and --until take RFC 3339 times or durations ago.
func TestEventFlagsFilter(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		args         []string
		key          *string
		since, until time.Time
	}{
		{args: []string{"--topic", "orders"}},
		{args: []string{"--key", ""}, key: new(string)},
		{args: []string{"--since", "2h", "--until", "2026-01-02T15:00:00Z"}, since: now.Add(-2 * time.Hour), until: time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)},
	} {
		var f eventFlags
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.register(fs, "events", "created")
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		ef, err := f.filter(fs, now)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if (ef.key == nil) != (c.key == nil) || ef.key != nil && *ef.key != *c.key {
			t.Errorf("%v: key %v, want %v", c.args, ef.key, c.key)
		}
		if got := ef.since; (got == nil) != c.since.IsZero() || got != nil && !got.Equal(c.since) {
			t.Errorf("%v: since %v, want %v", c.args, got, c.since)
		}
		if got := ef.until; (got == nil) != c.until.IsZero() || got != nil && !got.Equal(c.until) {
			t.Errorf("%v: until %v, want %v", c.args, got, c.until)
		}
	}
	var f eventFlags
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f.register(fs, "events", "created")
	if err := fs.Parse([]string{"--until", "yesterday"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.filter(fs, now); err == nil {
		t.Error("--until yesterday: no error")
	}
}
