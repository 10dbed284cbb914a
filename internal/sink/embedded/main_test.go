package embedded

import (
	"testing"

	"github.com/outboxrelay/relay/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Exit(m.Run()) }
