package relay

import (
	"errors"
	"testing"
	"time"
)

// TestRouteRefusesTheRelaysHeaders: a row cannot set the headers the relay
// owns (consumers deduplicate by relay-event-id), in any letter case; the
// event goes to the dead letters as invalid headers.
func TestRouteRefusesTheRelaysHeaders(t *testing.T) {
	for _, h := range []string{`{"relay-event-id":"forged"}`, `{"Relay-Replay":"1"}`, `{"ok":"1","RELAY-created-at":"x"}`} {
		_, err := Route(Event{EventID: "e", Topic: "orders", Headers: []byte(h), CreatedAt: time.Now()}, 1<<20)
		var re *RouteError
		if !errors.As(err, &re) || re.Reason != ReasonInvalidHeaders || !errors.Is(err, ErrInvalidHeaders) {
			t.Errorf("headers %s: %v, want an invalid-headers route error", h, err)
		}
	}
	m, err := Route(Event{EventID: "e", Topic: "orders", Headers: []byte(`{"relayed":"yes","trace-id":"t"}`), CreatedAt: time.Now()}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(m.EventID()); got != "e" || m.Identity() != "e" {
		t.Fatalf("event id %q, identity %q", got, m.Identity())
	}
}
