package cli_test

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/testbin"
)

// TestSIGTERMWhileConnecting: a relay stopped before PostgreSQL answers
// still stops cleanly, with exit 0.
func TestSIGTERMWhileConnecting(t *testing.T) {
	t.Parallel()
	// A server that accepts connections and never says a word.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	p := e2e.Start(t, testbin.Relay(t), nil, "run", "--database-url", "postgres://u@"+silent.Addr().String()+"/x",
		"--http-addr", "", "--kafka-addr", "", "--data-dir", t.TempDir())
	time.Sleep(time.Second)
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM while connecting, want 0:\n%s", code, p.Output())
	}
}

// TestRunRejectsBadFlags: bad flag values give one clear line and exit 2.
func TestRunRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--source", "kafka"},
		{"--sink", "s3"},
		{"--sink", "kafka"},
		{"--batch-size", "0"},
		{"--fsync", "never"},
		{"--ack-interval", "-1s"},
		{"--leader-lease", "10ms"},
		{"--kafka-addr", "no-port"},
		{"--create-topics=false", "--kafka-addr", ""},
		{"--log-level", "loud"},
	} {
		r := relay(t, nil, append([]string{"run"}, args...)...)
		if r.Code != 2 || r.Stderr == "" {
			t.Errorf("relay run %v: exit %d, stderr %q; want exit 2 and a message", args, r.Code, r.Stderr)
		}
	}
}

// TestKafkaListenerThatCannotBindIsNotReady: with its Kafka address taken,
// the leader reports not ready and says why, and becomes ready once the
// address is free.
func TestKafkaListenerThatCannotBindIsNotReady(t *testing.T) {
	url, bin := e2e.Migrated(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	httpAddr := e2e.FreeAddr(t)
	p := e2e.Start(t, bin, nil, "run", "--database-url", url, "--data-dir", t.TempDir(), "--http-addr", httpAddr,
		"--kafka-addr", taken.Addr().String())
	deadline := time.Now().Add(time.Minute)
	var body struct {
		Ready  bool   `json:"ready"`
		Reason string `json:"reason"`
	}
	for {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if strings.Contains(body.Reason, "Kafka listener") {
				break
			}
			if body.Ready {
				t.Fatal("ready with its Kafka address taken")
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never named the Kafka listener; last reason %q\n%s", body.Reason, p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(body.Reason, taken.Addr().String()) {
		t.Errorf("the reason does not name the address: %q", body.Reason)
	}
	taken.Close()
	e2e.WaitReady(t, p, true, time.Minute)
}
