package poller_test

import (
	"testing"
	"time"

	"github.com/outboxrelay/relay/poller"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/relaytest"
)

func TestSourceConformance(t *testing.T) {
	relaytest.RunSourceTests(t, func(t *testing.T, url string) relay.Source {
		// A long poll interval: waking must come from LISTEN/NOTIFY.
		p, err := poller.New(poller.Config{DatabaseURL: url, PollInterval: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return p
	})
}

func TestConfigValidation(t *testing.T) {
	if _, err := poller.New(poller.Config{Schema: "Bad Schema"}); err == nil {
		t.Fatal("New accepted an invalid schema")
	}
	if _, err := poller.New(poller.Config{DatabaseURL: "postgres://u:pw@host:notaport/db"}); err == nil {
		t.Fatal("New accepted an invalid URL")
	}
}
