package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

type deadLetterJSON struct {
	ID         int64  `json:"id"`
	EventID    string `json:"event_id"`
	Topic      string `json:"topic"`
	Reason     string `json:"reason"`
	Error      string `json:"error"`
	Resolution string `json:"resolution"`
	Note       string `json:"note"`
}

func listDeadLetters(t *testing.T, url string, args ...string) []deadLetterJSON {
	t.Helper()
	r := relay(t, nil, append([]string{"dead-letters", "list", "--json", "--database-url", url}, args...)...)
	if r.Code != 0 {
		t.Fatalf("dead-letters list: exit %d: %s", r.Code, r.Stderr)
	}
	var ds []deadLetterJSON
	if err := json.Unmarshal([]byte(r.Stdout), &ds); err != nil {
		t.Fatalf("dead-letters list --json: %v\n%s", err, r.Stdout)
	}
	return ds
}

// runUntilDrained runs the relay until the outbox is empty, then stops it
// with SIGTERM.
func runUntilDrained(t *testing.T, bin, url, dataDir string, extra ...string) {
	t.Helper()
	p := e2e.Start(t, bin, nil, append([]string{"run", "--database-url", url, "--data-dir", dataDir, "--http-addr", e2e.FreeAddr(t),
		"--kafka-addr", "", "--poll-interval", "100ms"}, extra...)...)
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	p.Stop(30 * time.Second)
}

// TestDeadLetterCommands: events the relay could not publish are listed and
// shown; retry puts them back into the outbox in their order with their
// original event ids, and the relay then publishes them; discard needs a
// note and leaves the record; neither acts without being told which.
func TestDeadLetterCommands(t *testing.T) {
	url, bin := e2e.Migrated(t)
	conn := pgtest.Connect(t, url)
	ctx := context.Background()
	dataDir := e2e.DataDir(t)
	big := strings.Repeat("x", 400)
	for _, row := range []struct{ topic, payload, headers string }{
		{"orders", "good-0", ""},
		{"orders", big + "-1", ""},
		{"bad topic!", "bad-2", ""},
		{"orders", "good-3", ""},
		{"orders", big + "-4", ""},
		{"orders", "forged-5", `{"relay-event-id":"not-mine"}`},
		{"orders", "good-6", ""},
	} {
		var h any
		if row.headers != "" {
			h = row.headers
		}
		if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ($1, 'k', convert_to($2, 'UTF8'), $3::text::jsonb)`,
			row.topic, row.payload, h); err != nil {
			t.Fatal(err)
		}
	}
	runUntilDrained(t, bin, url, dataDir, "--max-message-bytes", "300")

	ds := listDeadLetters(t, url)
	reasons := map[string]int{}
	for _, d := range ds {
		reasons[d.Reason]++
	}
	if len(ds) != 4 || reasons["too_large"] != 2 || reasons["invalid_topic"] != 1 || reasons["invalid_headers"] != 1 {
		t.Fatalf("dead letters: %+v", ds)
	}
	show := relay(t, nil, "dead-letters", "show", "--database-url", url, "1")
	if show.Code != 0 || !strings.Contains(show.Stdout, ds[0].EventID) || !strings.Contains(show.Stdout, "too_large") {
		t.Fatalf("dead-letters show 1: exit %d\n%s%s", show.Code, show.Stdout, show.Stderr)
	}
	if r := relay(t, nil, "dead-letters", "retry", "--database-url", url); r.Code != 2 {
		t.Fatalf("retry without ids or filters: exit %d, want 2: %s", r.Code, r.Stderr)
	}
	if r := relay(t, nil, "dead-letters", "discard", "--database-url", url, "--reason", "invalid_topic"); r.Code != 2 || !strings.Contains(r.Stderr, "--note") {
		t.Fatalf("discard without --note: exit %d: %s", r.Code, r.Stderr)
	}
	if r := relay(t, nil, "dead-letters", "retry", "--database-url", url, "--reason", "too_large"); r.Code != 0 || !strings.Contains(r.Stdout, "2 dead letters") {
		t.Fatalf("retry --reason too_large: exit %d: %s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := relay(t, nil, "dead-letters", "discard", "--database-url", url, "--reason", "invalid_topic", "--note", "no such topic, ever"); r.Code != 0 {
		t.Fatalf("discard: exit %d: %s", r.Code, r.Stderr)
	}
	// Retrying again finds nothing unresolved of that reason.
	if r := relay(t, nil, "dead-letters", "retry", "--database-url", url, "--reason", "too_large"); r.Code != 0 || !strings.Contains(r.Stdout, "0 dead letters") {
		t.Fatalf("second retry: exit %d: %s", r.Code, r.Stdout)
	}
	left := listDeadLetters(t, url)
	if len(left) != 1 || left[0].Reason != "invalid_headers" {
		t.Fatalf("unresolved after retry and discard: %+v", left)
	}
	all := listDeadLetters(t, url, "--resolved")
	states := map[string]string{}
	for _, d := range all {
		states[d.Reason+"/"+d.Resolution] = d.Note
	}
	if len(all) != 4 || states["invalid_topic/discarded"] != "no such topic, ever" {
		t.Fatalf("the record of resolutions: %+v", all)
	}

	// With a limit that fits, the retried events are published, in their
	// order and with their original event ids.
	runUntilDrained(t, bin, url, dataDir)
	var got []string
	ids := map[string]string{}
	for _, r := range e2e.ReadLog(t, dataDir, "orders") {
		v := string(r.Value)
		if strings.HasPrefix(v, big) {
			v = "big" + strings.TrimPrefix(v, big)
		}
		got = append(got, v)
		ids[v] = r.Headers["relay-event-id"]
	}
	want := "good-0 good-3 good-6 big-1 big-4"
	if strings.Join(got, " ") != want {
		t.Fatalf("the log holds %v, want %s", got, want)
	}
	for _, d := range ds {
		if d.Reason == "too_large" {
			found := false
			for _, id := range ids {
				found = found || id == d.EventID
			}
			if !found {
				t.Errorf("dead letter %d's event id %s is not in the log", d.ID, d.EventID)
			}
		}
	}
}
