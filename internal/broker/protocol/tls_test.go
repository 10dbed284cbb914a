package protocol

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/testcerts"
)

func consumeAll(t testing.TB, ctx context.Context, cl *kgo.Client, want int) []*kgo.Record {
	t.Helper()
	var got []*kgo.Record
	for len(got) < want {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", len(got), want, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		got = append(got, fs.Records()...)
	}
	return got
}

// TestTLSListener: with Config.TLS the listener speaks TLS only; franz-go
// and kcat produce and consume over it, a plaintext client gets nowhere,
// and with client certificates required a client without one is refused.
func TestTLSListener(t *testing.T) {
	t.Parallel()
	certs := testcerts.New(t, "consumer-app")
	for _, mutual := range []bool{false, true} {
		t.Run(map[bool]string{false: "server", true: "mutual"}[mutual], func(t *testing.T) {
			f := setup(t, func(c *Config) { c.TLS = certs.ServerConfig(t, mutual) })
			ctx := testContext(t, 60*time.Second)
			const topic = "tls-orders"
			f.createTopic(t, topic, 2)

			cl := newKgo(t, f.addr, kgo.DialTLSConfig(certs.ClientConfig(t, mutual)), kgo.ConsumeTopics(topic))
			defer cl.Close()
			produceKeyed(t, ctx, cl, topic, 20)
			if got := consumeAll(t, ctx, cl, 20); len(got) != 20 {
				t.Fatalf("consumed %d records over TLS, want 20", len(got))
			}

			args := []string{"-b", f.addr, "-X", "security.protocol=ssl", "-X", "ssl.ca.location=" + certs.CAFile, "-X", "ssl.endpoint.identification.algorithm=none"}
			if mutual {
				args = append(args, "-X", "ssl.certificate.location="+certs.ClientCert, "-X", "ssl.key.location="+certs.ClientKey)
			}
			out := runKcat(t, ctx, "", append(args, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%k\n")...)
			if n := len(strings.Fields(out)); n != 20 {
				t.Errorf("kcat over TLS read %d records, want 20:\n%s", n, out)
			}

			refused := func(name string, opts ...kgo.Opt) {
				t.Helper()
				cl := newKgo(t, f.addr, append(opts, kgo.RequestRetries(0), kgo.RetryTimeout(time.Second))...)
				defer cl.Close()
				pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				if err := cl.Ping(pctx); err == nil {
					t.Errorf("%s: ping succeeded, want the listener to refuse it", name)
				}
			}
			refused("plaintext client")
			if mutual {
				refused("TLS client without a certificate", kgo.DialTLSConfig(certs.ClientConfig(t, false)))
				if out, err := tryKcat(t, ctx, "", append(args[:8], "-L", "-m", "3")...); err == nil {
					t.Errorf("kcat without a client certificate listed metadata:\n%s", out)
				}
			}
		})
	}
}
