package cli_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
	"github.com/outboxrelay/relay/internal/testcerts"
)

// TestSecuredListenerAndSecrets runs `relay run` with TLS on both
// listeners, SASL users and ACLs, and a database password, and drives it
// as clients would: franz-go and kcat over TLS with SCRAM read the outbox
// topic with the right credentials and are refused with wrong or missing
// ones, a produce to the outbox topic gets TOPIC_AUTHORIZATION_FAILED, and
// a group ACL keeps a foreign principal out of a group. Then every log
// line, /metrics, `relay status`, and the errors of commands given bad
// input are searched for the secrets: the TLS private keys, the SASL
// passwords (right and wrong) and the database password.
func TestSecuredListenerAndSecrets(t *testing.T) {
	t.Parallel()
	kcat := kcatPath(t)
	const (
		dbPassword    = "Db-Pa55-9f3c1e"
		alicePassword = "alice-Pa55-77ab"
		bobPassword   = "bob-Pa55-12cd"
		adminPassword = "admin-Pa55-e0f1"
		wrongPassword = "wrong-Pa55-5566"
	)
	adminURL := pgtest.NewDatabase(t)
	admin := pgtest.Connect(t, adminURL)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if _, err := admin.Exec(ctx, "CREATE ROLE relay_secret LOGIN SUPERUSER PASSWORD '"+dbPassword+"'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP ROLE IF EXISTS relay_secret") })
	u, err := url.Parse(adminURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("relay_secret", dbPassword)
	dbURL := u.String()

	var shown []string // everything the relay printed or served
	run := func(args ...string) (int, string) {
		t.Helper()
		r := relay(t, nil, args...)
		shown = append(shown, r.Stdout, r.Stderr)
		return r.Code, r.Stdout + r.Stderr
	}
	if code, out := run("migrate", "up", "--database-url", dbURL); code != 0 {
		t.Fatal(out)
	}
	for i := range 20 {
		if _, err := admin.Exec(ctx, `SELECT outbox.emit('orders', $1, $2::text, '{}'::jsonb)`, fmt.Sprint(i), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	kafkaCerts, httpCerts := testcerts.New(t, "client"), testcerts.New(t, "prometheus")
	usersFile := filepath.Join(dir, "users")
	for user, pw := range map[string]string{"alice": alicePassword, "bob": bobPassword, "admin": adminPassword} {
		pwFile := filepath.Join(dir, user+".pw")
		if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if code, out := run("listener-users", "add", "--users-file", usersFile, "--user", user, "--password-file", pwFile); code != 0 {
			t.Fatal(out)
		}
	}
	kafkaAddr, httpAddr := e2e.FreeAddr(t), e2e.FreeAddr(t)
	p := e2e.Start(t, testbin.Relay(t), nil, "run", "--database-url", dbURL, "--data-dir", e2e.DataDir(t),
		"--log-level", "debug", "--log-format", "json", "--partitions", "2",
		"--kafka-addr", kafkaAddr, "--http-addr", httpAddr,
		"--listener-tls-cert-file", kafkaCerts.ServerCert, "--listener-tls-key-file", kafkaCerts.ServerKey,
		"--listener-users-file", usersFile, "--listener-sasl-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
		"--listener-acl-file", filepath.Join(dir, "acls.json"), "--listener-super-users", "User:admin",
		"--http-tls-cert-file", httpCerts.ServerCert, "--http-tls-key-file", httpCerts.ServerKey)
	e2e.WaitDrained(t, adminURL, "outbox", time.Minute)

	client := func(mech, user, pass string, opts ...kgo.Opt) *kgo.Client {
		t.Helper()
		opts = append(opts, kgo.SeedBrokers(kafkaAddr), kgo.DialTLSConfig(kafkaCerts.ClientConfig(t, false)))
		switch mech {
		case "SCRAM-SHA-256":
			opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()))
		case "SCRAM-SHA-512":
			opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
		case "PLAIN":
			opts = append(opts, kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism()))
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	poll := func(cl *kgo.Client, want int) error {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		got := 0
		for got < want {
			fs := cl.PollFetches(pctx)
			if err := pctx.Err(); err != nil {
				return fmt.Errorf("read %d of %d records: %w", got, want, err)
			}
			var ferr error
			fs.EachError(func(_ string, _ int32, err error) { ferr = err })
			if ferr != nil {
				return ferr
			}
			got += fs.NumRecords()
		}
		return nil
	}

	// The right credentials read the outbox topic.
	t.Log("The right credentials read the outbox topic.")
	alice := client("SCRAM-SHA-512", "alice", alicePassword, kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err := poll(alice, 20); err != nil {
		t.Fatalf("alice reading orders: %v", err)
	}
	// Wrong or missing credentials are refused.
	t.Log("Wrong or missing credentials are refused.")
	for _, c := range []struct{ mech, user, pass string }{
		{"SCRAM-SHA-256", "alice", wrongPassword}, {"SCRAM-SHA-512", "alice", wrongPassword},
		{"PLAIN", "alice", wrongPassword}, {"SCRAM-SHA-256", "mallory", wrongPassword}, {"", "", ""},
	} {
		cl := client(c.mech, c.user, c.pass, kgo.RequestRetries(0), kgo.RetryTimeout(time.Second))
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := cl.Ping(pctx)
		cancel()
		if err == nil {
			t.Errorf("%s as %q with a wrong password: ping succeeded", c.mech, c.user)
		}
	}
	// Producing to the outbox topic is the relay's alone.
	t.Log("Producing to the outbox topic is the relay's alone.")
	perr := alice.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte("forged")}).FirstErr()
	if !errors.Is(perr, kerr.TopicAuthorizationFailed) {
		t.Errorf("alice producing to orders: %v, want TOPIC_AUTHORIZATION_FAILED", perr)
	}
	// A group ACL keeps bob out of alice's group.
	t.Log("A group ACL keeps bob out of alice's group.")
	adm := kadm.NewClient(client("SCRAM-SHA-256", "admin", adminPassword))
	if res, err := adm.CreateACLs(ctx, kadm.NewACLs().Allow("User:alice").Groups("alice-group").Operations(kadm.OpRead)); err != nil || res[0].Err != nil {
		t.Fatalf("creating the group ACL: %v %v", err, res)
	}
	inGroup := client("SCRAM-SHA-256", "alice", alicePassword, kgo.ConsumerGroup("alice-group"), kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err := poll(inGroup, 20); err != nil {
		t.Fatalf("alice in her group: %v", err)
	}
	bob := client("SCRAM-SHA-256", "bob", bobPassword, kgo.ConsumerGroup("alice-group"), kgo.ConsumeTopics("orders"))
	if err := poll(bob, 1); !errors.Is(err, kerr.GroupAuthorizationFailed) {
		t.Errorf("bob joining alice's group: %v, want GROUP_AUTHORIZATION_FAILED", err)
	}
	// kcat (librdkafka) with the right and a wrong password.
	t.Log("kcat (librdkafka) with the right and a wrong password.")
	kcatArgs := func(pw string) []string {
		return []string{"-b", kafkaAddr, "-X", "security.protocol=sasl_ssl", "-X", "ssl.ca.location=" + kafkaCerts.CAFile,
			"-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", "sasl.username=bob", "-X", "sasl.password=" + pw}
	}
	out, err := exec.CommandContext(ctx, kcat, append(kcatArgs(bobPassword), "-C", "-t", "orders", "-o", "beginning", "-e", "-q", "-f", "%k\n")...).CombinedOutput()
	if n := len(strings.Fields(string(out))); err != nil || n != 20 {
		t.Errorf("kcat as bob: %v, %d records:\n%s", err, n, out)
	}
	kctx, kcancel := context.WithTimeout(ctx, 15*time.Second)
	out, err = exec.CommandContext(kctx, kcat, append(kcatArgs(wrongPassword), "-L", "-m", "5")...).CombinedOutput()
	kcancel()
	if err == nil {
		t.Errorf("kcat with a wrong password listed metadata:\n%s", out)
	}

	// /metrics over HTTPS, relay status, and commands that fail.
	t.Log("/metrics over HTTPS, relay status, and commands that fail.")
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: httpCerts.ClientConfig(t, false)}, Timeout: 10 * time.Second}
	resp, err := hc.Get("https://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), "relay_listener_authentication_failures_total") {
		t.Errorf("/metrics lacks the listener's metrics")
	}
	shown = append(shown, string(metrics))
	if _, out := run("status", "--database-url", dbURL, "--http-addr", httpAddr, "--http-tls-ca-file", httpCerts.CAFile, "--json"); !strings.Contains(out, `"role": "leader"`) {
		t.Errorf("relay status over HTTPS does not show the leader:\n%s", out)
	}
	run("status", "--database-url", dbURL, "--http-addr", httpAddr)
	run("status", "--database-url", dbURL, "--json", "--http-addr", "")
	bad := *u
	bad.User = url.UserPassword("relay_secret", wrongPassword)
	if code, _ := run("status", "--database-url", bad.String(), "--http-addr", ""); code == 0 {
		t.Log("status with a wrong database password succeeded (the cluster trusts local connections)")
	}
	for _, args := range [][]string{
		{"--listener-tls-cert-file", kafkaCerts.ServerKey, "--listener-tls-key-file", kafkaCerts.ServerKey},
		{"--listener-tls-cert-file", kafkaCerts.ServerCert, "--listener-tls-key-file", httpCerts.ServerKey},
		{"--http-tls-cert-file", httpCerts.ServerKey, "--http-tls-key-file", httpCerts.ServerKey},
		{"--listener-users-file", kafkaCerts.ServerKey},
		{"--listener-acl-file", kafkaCerts.ServerKey},
	} {
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		r, err := testbin.Run(rctx, testbin.Relay(t), []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()},
			append([]string{"run", "--database-url", dbURL, "--data-dir", e2e.DataDir(t), "--kafka-addr", e2e.FreeAddr(t), "--http-addr", e2e.FreeAddr(t)}, args...)...)
		rcancel()
		if err != nil || r.Code == 0 {
			t.Errorf("run %v: %v, exit %d: %s", args, err, r.Code, r.Stderr)
		}
		shown = append(shown, r.Stdout, r.Stderr)
	}
	p.Signal(syscall.SIGTERM)
	p.Wait(time.Minute)
	shown = append(shown, p.Output())

	secrets := map[string]string{"database password": dbPassword, "alice's password": alicePassword, "bob's password": bobPassword,
		"admin's password": adminPassword, "the wrong password": wrongPassword}
	for name, pem := range map[string]string{"the listener's key": kafkaCerts.KeyPEM, "the HTTP key": httpCerts.KeyPEM} {
		for i, line := range strings.Split(pem, "\n") {
			if len(line) > 16 && !strings.HasPrefix(line, "-----") {
				secrets[fmt.Sprintf("%s (line %d)", name, i)] = line
			}
		}
	}
	all := strings.Join(shown, "\n")
	// The search proves something only if the output is there: the
	// failed authentications and the database user (whose password must
	// not follow it).
	for _, want := range []string{"kafka SASL authentication failed", "relay_secret@127.0.0.1", "relay_listener_connections"} {
		if !strings.Contains(all, want) {
			t.Fatalf("the %d bytes of output collected lack %q: the search would prove nothing", len(all), want)
		}
	}
	for name, secret := range secrets {
		if strings.Contains(all, secret) {
			i := strings.Index(all, secret)
			t.Errorf("%s appears in the output: ...%s...", name, all[max(0, i-200):i])
		}
	}
}
