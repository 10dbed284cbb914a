package cli_test

import (
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testwait"
)

// eventually waits until check returns nil (testwait.Until).
func eventually(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	testwait.Until(t, timeout, what, check)
}
