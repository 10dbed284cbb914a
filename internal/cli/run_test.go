package cli_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/buildinfo"
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
	time.Sleep(time.Second) // deliberate pause: the relay sits in the silent server's connect before it is stopped
	p.Stop(10 * time.Second)
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
		{"--cloudevents", "json"},
		{"--cloudevents-dataschema-url", "registry:9464"},
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
	var reason string
	eventually(t, time.Minute, "/readyz never named the Kafka listener", func() error {
		if reason = p.ReadyReason(); strings.Contains(reason, "Kafka listener") {
			return nil
		}
		if ready, _ := p.Ready(); ready {
			t.Fatal("ready with its Kafka address taken")
		}
		return fmt.Errorf("last reason %q", reason)
	})
	if !strings.Contains(reason, taken.Addr().String()) {
		t.Errorf("the reason does not name the address: %q", reason)
	}
	// relay run's checks at start said it once, in relay doctor's words.
	if n := strings.Count(p.Output(), "check=kafka-listener"); n != 1 {
		t.Errorf("the kafka-listener check's failure was logged %d times, want once:\n%s", n, p.Output())
	}
	if !strings.Contains(p.Output(), "address in use") {
		t.Errorf("the log does not say the address is in use:\n%s", p.Output())
	}
	metrics, err := httpBody("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^relay_build_info\{commit="[^"]+",goversion="go[^"]+",version="` + regexp.QuoteMeta(buildinfo.Version) + `"\} 1$`).MatchString(metrics) {
		t.Errorf("/metrics has no relay_build_info of version %s", buildinfo.Version)
	}
	taken.Close()
	e2e.WaitReady(t, p, true, time.Minute)
}

func httpBody(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
