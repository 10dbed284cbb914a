package cli_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
)

// eventually retries check every 100ms until it returns nil or timeout.
func eventually(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopRelay stops p with SIGTERM and fails the test unless it exits 0
// within timeout.
func stopRelay(t *testing.T, p *e2e.Proc, timeout time.Duration) {
	t.Helper()
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(timeout); code != 0 {
		t.Fatalf("relay exited %d after SIGTERM, want 0:\n%s", code, p.Output())
	}
}
