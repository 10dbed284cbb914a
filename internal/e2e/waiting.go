package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/pgtest"
)

// Waiting is what WatchWaiting saw.
type Waiting struct {
	// Rows are the outbox's row counts, one per sample.
	Rows []int64
	// Reason is the last /readyz reason.
	Reason string
	// Status is the output of `relay status` during the wait.
	Status string
}

// WatchWaiting watches, for d, a relay p whose destination refuses topic
// for now (a missing topic, say), while writers keep committing events
// for it. Every second it checks that /readyz fails naming the topic, that
// the outbox keeps every row (its oldest row stays, the table never
// shrinks), that no row went to the dead letters, and that
// relay_destination_waiting_since_timestamp_seconds has a sample for the
// topic; once, that `relay status` (bin, against url and p) has a line for
// the waiting topic.
func WatchWaiting(t testing.TB, p *Proc, bin, url, topic string, d time.Duration) Waiting {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	conn := pgtest.Connect(t, url)
	var w Waiting
	var oldest int64
	for began := time.Now(); time.Since(began) < d; time.Sleep(time.Second) {
		if p.Exited() {
			t.Fatalf("the relay exited while the destination refused %s:\n%s", topic, p.Output())
		}
		if ok, _ := p.Ready(); ok {
			t.Errorf("/readyz reports ready while the destination refuses %s", topic)
		}
		w.Reason = p.ReadyReason()
		if !strings.Contains(w.Reason, "topic "+topic) {
			t.Errorf("/readyz reason %q does not name the topic %s", w.Reason, topic)
		}
		var n, minID, dead int64
		if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox.events), (SELECT coalesce(min(id), 0) FROM outbox.events),
    (SELECT count(*) FROM outbox.dead_letters)`).Scan(&n, &minID, &dead); err != nil {
			t.Fatal(err)
		}
		if oldest == 0 {
			oldest = minID
		} else if minID != oldest {
			t.Errorf("the oldest outbox row changed from %d to %d while the destination refused %s: rows left the outbox", oldest, minID, topic)
		}
		if dead > 0 {
			t.Fatalf("%d events went to the dead letters while the destination refused %s", dead, topic)
		}
		w.Rows = append(w.Rows, n)
		if !waitingSample(t, p.HTTPAddr, topic) {
			t.Errorf("no relay_destination_waiting_since_timestamp_seconds sample for topic %s", topic)
		}
		if w.Status == "" {
			s := Start(t, bin, nil, "status", "--database-url", url, "--http-addr", p.HTTPAddr)
			if code := s.Wait(time.Minute); code != 0 {
				t.Fatalf("relay status: exit %d: %s", code, s.Output())
			}
			w.Status = s.Output()
			if !strings.Contains(w.Status, "waiting topic "+topic) {
				t.Errorf("relay status has no line for the waiting topic %s:\n%s", topic, w.Status)
			}
		}
	}
	if len(w.Rows) == 0 || w.Rows[0] == 0 || !slices.IsSorted(w.Rows) {
		t.Errorf("outbox rows while the destination refused %s: %v, want a non-empty table that never shrinks", topic, w.Rows)
	}
	return w
}

// waitingSample reports whether the relay at addr exports a
// relay_destination_waiting_since_timestamp_seconds sample for topic.
func waitingSample(t testing.TB, addr, topic string) bool {
	t.Helper()
	for _, line := range MetricLines(t, addr) {
		if strings.HasPrefix(line, "relay_destination_waiting_since_timestamp_seconds{") && strings.Contains(line, `topic="`+topic+`"`) {
			return true
		}
	}
	return false
}

// ResumeAfterWaiting follows the creation of the topic relay p waited
// for: p is ready again within a minute, the writers go on for 2 s (some
// events written after the topic exists), stopWriting ends them, and the
// outbox of url drains.
func ResumeAfterWaiting(t testing.TB, p *Proc, url string, stopWriting func() error) {
	t.Helper()
	WaitReady(t, p, true, time.Minute)
	time.Sleep(2 * time.Second)
	if err := stopWriting(); err != nil {
		t.Fatalf("writers: %v", err)
	}
	WaitDrained(t, url, "outbox", 2*time.Minute)
}

// CheckWaitEnded fails the test when the outbox of url has dead letters
// after a wait for a topic, or when output, the log of the stopped relay,
// has the wait's warning never or more than once for ten of the committed
// events: it is logged once an interval, not once an event. It returns
// how many times the warning was logged.
func CheckWaitEnded(t testing.TB, url, output string, committed int) (logged int) {
	t.Helper()
	var dead int
	if err := pgtest.Connect(t, url).QueryRow(context.Background(), "SELECT count(*) FROM outbox.dead_letters").Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead > 0 {
		t.Errorf("%d dead letters, want 0", dead)
	}
	logged = strings.Count(output, "events wait in the outbox: the destination refuses their topic")
	if logged == 0 || logged > committed/10 {
		t.Errorf("the wait was logged %d times for %d events: want a line per interval, not per event", logged, committed)
	}
	return logged
}
