package protocol

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxrelay/relay/internal/testcerts"
)

// writeUsersFile writes a users file with SCRAM-SHA-256 and -512
// credentials for each name -> password.
func writeUsersFile(t testing.TB, path string, users map[string]string) {
	t.Helper()
	creds := map[string]map[string]Credential{}
	for name, pass := range users {
		creds[name] = map[string]Credential{}
		for _, m := range SCRAMMechanisms {
			c, err := NewCredential(m, pass, MinSCRAMIterations)
			if err != nil {
				t.Fatal(err)
			}
			creds[name][m] = c
		}
	}
	if err := WriteUsers(path, creds); err != nil {
		t.Fatal(err)
	}
}

// saslFixture is a listener with TLS and SASL (PLAIN, SCRAM-SHA-256 and
// -512) for the users in its users file.
type saslFixture struct {
	*fixture
	certs     *testcerts.Set
	usersPath string
}

func setupSASL(t *testing.T, users map[string]string, cfg func(*Config)) *saslFixture {
	t.Helper()
	certs := testcerts.New(t, "client")
	path := filepath.Join(t.TempDir(), "users")
	writeUsersFile(t, path, users)
	uf, err := OpenUsersFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f := setup(t, func(c *Config) {
		c.TLS = certs.ServerConfig(t, false)
		c.Users = uf
		c.SASLMechanisms = []string{MechanismPlain, MechanismSCRAM256, MechanismSCRAM512}
		c.HandshakeTimeout = 3 * time.Second
		if cfg != nil {
			cfg(c)
		}
	})
	return &saslFixture{fixture: f, certs: certs, usersPath: path}
}

func saslMech(mech, user, pass string) sasl.Mechanism {
	switch mech {
	case MechanismPlain:
		return plain.Auth{User: user, Pass: pass}.AsMechanism()
	case MechanismSCRAM256:
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
	}
	return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
}

// kgoAs is a franz-go client over TLS, authenticating with mech when set.
func (f *saslFixture) kgoAs(t testing.TB, mech, user, pass string, opts ...kgo.Opt) *kgo.Client {
	opts = append(opts, kgo.DialTLSConfig(f.certs.ClientConfig(t, false)))
	if mech != "" {
		opts = append(opts, kgo.SASL(saslMech(mech, user, pass)))
	}
	cl := newKgo(t, f.addr, opts...)
	t.Cleanup(cl.Close)
	return cl
}

// kcatArgs are kcat's arguments to connect over TLS as user, with mech.
func (f *saslFixture) kcatArgs(mech, user, pass string) []string {
	return []string{"-b", f.addr, "-X", "security.protocol=sasl_ssl", "-X", "ssl.ca.location=" + f.certs.CAFile,
		"-X", "sasl.mechanisms=" + mech, "-X", "sasl.username=" + user, "-X", "sasl.password=" + pass}
}

func pingFails(t *testing.T, ctx context.Context, cl *kgo.Client) error {
	t.Helper()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return cl.Ping(pctx)
}

// TestSASLOverTLSWithFranzGo: with users configured, franz-go clients with
// the right credentials produce and consume over TLS with each mechanism;
// a wrong password, an unknown user and a client without SASL are all
// refused.
func TestSASLOverTLSWithFranzGo(t *testing.T) {
	t.Parallel()
	const pass = "correct horse battery staple"
	f := setupSASL(t, map[string]string{"alice": pass}, nil)
	ctx := testContext(t, 90*time.Second)
	const topic = "sasl-orders"
	f.createTopic(t, topic, 2)
	for i, mech := range []string{MechanismSCRAM256, MechanismSCRAM512, MechanismPlain} {
		cl := f.kgoAs(t, mech, "alice", pass, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		produceKeyed(t, ctx, cl, topic, 10)
		if got := consumeAll(t, ctx, cl, 10*(i+1)); len(got) < 10*(i+1) {
			t.Fatalf("%s: consumed %d records", mech, len(got))
		}
	}
	for _, c := range []struct{ name, mech, user, pass string }{
		{"wrong SCRAM-SHA-256 password", MechanismSCRAM256, "alice", "wrong"},
		{"wrong SCRAM-SHA-512 password", MechanismSCRAM512, "alice", "wrong"},
		{"wrong PLAIN password", MechanismPlain, "alice", "wrong"},
		{"unknown user", MechanismSCRAM256, "mallory", pass},
		{"no SASL", "", "", ""},
	} {
		cl := f.kgoAs(t, c.mech, c.user, c.pass, kgo.RequestRetries(0), kgo.RetryTimeout(time.Second))
		if err := pingFails(t, ctx, cl); err == nil {
			t.Errorf("%s: ping succeeded", c.name)
		} else if c.mech != "" && !strings.Contains(err.Error(), kerr.SaslAuthenticationFailed.Message) {
			t.Errorf("%s: error %v, want SASL_AUTHENTICATION_FAILED", c.name, err)
		}
	}
	if n := f.srv.stats.authFailures.Load(); n < 4 {
		t.Errorf("%d authentication failures counted, want at least 4", n)
	}
}

// TestSASLOverTLSWithKcat: librdkafka authenticates with SCRAM-SHA-256 and
// -512 over TLS and reads what franz-go wrote; a wrong password fails.
func TestSASLOverTLSWithKcat(t *testing.T) {
	t.Parallel()
	const pass = "kcat-secret-pw"
	f := setupSASL(t, map[string]string{"bob": pass}, nil)
	ctx := testContext(t, 90*time.Second)
	const topic = "sasl-kcat"
	f.createTopic(t, topic, 1)
	produceKeyed(t, ctx, f.kgoAs(t, MechanismSCRAM512, "bob", pass), topic, 5)
	for _, mech := range []string{MechanismSCRAM256, MechanismSCRAM512} {
		out := runKcat(t, ctx, "", append(f.kcatArgs(mech, "bob", pass), "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%k\n")...)
		if n := len(strings.Fields(out)); n != 5 {
			t.Errorf("kcat %s read %d records, want 5:\n%s", mech, n, out)
		}
		if out, err := tryKcat(t, ctx, "", append(f.kcatArgs(mech, "bob", "wrong"), "-L", "-m", "5")...); err == nil {
			t.Errorf("kcat %s with a wrong password listed metadata:\n%s", mech, out)
		}
	}
}

// TestSASLHandshakeV0: after a SaslHandshake v0 the tokens travel unframed
// (PLAIN one, SCRAM two), and the connection then serves requests.
func TestSASLHandshakeV0(t *testing.T) {
	t.Parallel()
	const pass = "v0-password"
	f := setupSASL(t, map[string]string{"carol": pass}, func(c *Config) { c.TLS = nil })
	for _, mech := range []string{MechanismPlain, MechanismSCRAM256, MechanismSCRAM512} {
		rc := dialRaw(t, f.addr)
		hs := kmsg.NewPtrSASLHandshakeRequest()
		hs.Version, hs.Mechanism = 0, mech
		corr := rc.send(hs)
		hsResp := hs.ResponseKind().(*kmsg.SASLHandshakeResponse)
		if got := rc.recv(hsResp); got != corr || hsResp.ErrorCode != 0 {
			t.Fatalf("%s: handshake corr %d error %d", mech, got, hsResp.ErrorCode)
		}
		sess, tok, err := saslMech(mech, "carol", pass).Authenticate(context.Background(), f.addr)
		if err != nil {
			t.Fatal(err)
		}
		for done := false; !done; {
			rc.writeRaw(binary.BigEndian.AppendUint32(nil, uint32(len(tok))))
			rc.writeRaw(tok)
			challenge, err := rc.readFrame()
			if err != nil {
				t.Fatalf("%s: read token: %v", mech, err)
			}
			if done, tok, err = sess.Challenge(challenge); err != nil {
				t.Fatalf("%s: challenge: %v", mech, err)
			}
		}
		req := kmsg.NewPtrMetadataRequest()
		req.Version = 9
		corr = rc.send(req)
		resp := req.ResponseKind().(*kmsg.MetadataResponse)
		if got := rc.recv(resp); got != corr || len(resp.Brokers) != 1 {
			t.Fatalf("%s: metadata after v0 authentication: corr %d brokers %d", mech, got, len(resp.Brokers))
		}
	}
}

// TestSASLRequiredBeforeOtherRequests: before authentication a request
// other than ApiVersions and the SASL ones, a frame over 512 KiB, or
// taking longer than the handshake timeout closes the connection.
func TestSASLRequiredBeforeOtherRequests(t *testing.T) {
	t.Parallel()
	f := setupSASL(t, map[string]string{"dave": "pw"}, func(c *Config) { c.TLS = nil; c.HandshakeTimeout = 500 * time.Millisecond })

	rc := dialRaw(t, f.addr)
	av := kmsg.NewPtrApiVersionsRequest()
	av.Version = 3
	av.ClientSoftwareName, av.ClientSoftwareVersion = "test", "1"
	corr := rc.send(av)
	avResp := av.ResponseKind().(*kmsg.ApiVersionsResponse)
	if got := rc.recv(avResp); got != corr || avResp.ErrorCode != 0 {
		t.Fatalf("ApiVersions before authentication: corr %d error %d", got, avResp.ErrorCode)
	}
	var advertised []int16
	for _, k := range avResp.ApiKeys {
		advertised = append(advertised, k.ApiKey)
	}
	for _, k := range []int16{17, 36} {
		if !containsKey(advertised, k) {
			t.Errorf("ApiVersions does not advertise key %d", k)
		}
	}
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 9
	rc.send(md)
	rc.expectClosed()

	big := dialRaw(t, f.addr)
	big.writeRaw(binary.BigEndian.AppendUint32(nil, 1<<20))
	big.expectClosed()

	slow := dialRaw(t, f.addr)
	time.Sleep(time.Second) // deliberate pause: the silent client sends nothing past the server's deadline for it
	slow.expectClosed()
}

func containsKey(keys []int16, k int16) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

// TestUsersFileChangesApplyWithoutRestart: a user added to the users file
// can authenticate on the next connection, and a removed one cannot.
func TestUsersFileChangesApplyWithoutRestart(t *testing.T) {
	t.Parallel()
	f := setupSASL(t, map[string]string{"erin": "erin-pw"}, nil)
	ctx := testContext(t, 60*time.Second)
	if err := pingFails(t, ctx, f.kgoAs(t, MechanismSCRAM256, "frank", "frank-pw", kgo.RequestRetries(0))); err == nil {
		t.Fatal("frank authenticated before being added")
	}
	time.Sleep(10 * time.Millisecond) // deliberate pause: the users file is reloaded on a new modification time
	writeUsersFile(t, f.usersPath, map[string]string{"frank": "frank-pw"})
	if err := pingFails(t, ctx, f.kgoAs(t, MechanismSCRAM256, "frank", "frank-pw")); err != nil {
		t.Fatalf("frank after being added: %v", err)
	}
	if err := pingFails(t, ctx, f.kgoAs(t, MechanismSCRAM256, "erin", "erin-pw", kgo.RequestRetries(0))); err == nil {
		t.Fatal("erin authenticated after being removed")
	}
}
