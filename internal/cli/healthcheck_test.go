package cli

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/testcerts"
	"github.com/outboxrelay/relay/internal/testlog"
)

// runHealthcheck runs `relay healthcheck args...` as Main does, with env as
// its environment.
func runHealthcheck(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Main(append([]string{"healthcheck"}, args...), IO{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return env[k] }})
	return code, stdout.String(), stderr.String()
}

// healthStandIn answers /healthz 200 and /readyz 503, as a standby does.
var healthStandIn = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/healthz":
		w.Write([]byte("ok\n"))
	case "/readyz":
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"role":"standby","ready":false}` + "\n"))
	default:
		http.NotFound(w, r)
	}
})

// TestHealthcheck: exit 0 on 200, 1 on another status or no answer, 2 on a
// bad URL; each failure is one line on stderr.
func TestHealthcheck(t *testing.T) {
	stop, addr, err := serveHTTP("127.0.0.1:0", healthStandIn, nil, testlog.New(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// An address nothing listens on: a listener bound and closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()

	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stderr string
	}{
		{"healthz", nil, []string{"--url", "http://" + addr + "/healthz"}, 0, ""},
		{"url from the environment", map[string]string{"RELAY_URL": "http://" + addr + "/healthz"}, nil, 0, ""},
		{"standby's readyz", nil, []string{"--url", "http://" + addr + "/readyz"}, 1, "503 Service Unavailable"},
		{"unknown path", nil, []string{"--url", "http://" + addr + "/nope"}, 1, "404 Not Found"},
		{"nobody listening", nil, []string{"--url", "http://" + closed + "/healthz"}, 1, "connection refused"},
		{"not a URL", nil, []string{"--url", "127.0.0.1:9464/healthz"}, 2, "want http://host:port/path"},
		{"wrong scheme", nil, []string{"--url", "ftp://" + addr + "/healthz"}, 2, "want http://host:port/path"},
		{"bad timeout", nil, []string{"--url", "http://" + addr + "/healthz", "--timeout", "0s"}, 2, "--timeout must be positive"},
		{"argument", nil, []string{"extra"}, 2, "unexpected argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runHealthcheck(t, tc.env, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, tc.code, stdout, stderr)
			}
			if !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr %q does not say %q", stderr, tc.stderr)
			}
			if tc.code != 0 && strings.Contains(strings.TrimSpace(stderr), "\n") {
				t.Errorf("failure is not one line: %q", stderr)
			}
			if tc.code == 0 && !strings.HasPrefix(stdout, "healthy: ") {
				t.Errorf("stdout %q", stdout)
			}
		})
	}
}

// TestHealthcheckTLS: an https URL is checked against --tls-ca-file's CAs,
// and without them the daemon's certificate is refused.
func TestHealthcheckTLS(t *testing.T) {
	certs := testcerts.New(t, "probe")
	stop, addr, err := serveHTTP("127.0.0.1:0", healthStandIn, certs.ServerConfig(t, false), testlog.New(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	url := "https://" + addr + "/healthz"
	if code, _, stderr := runHealthcheck(t, nil, "--url", url, "--tls-ca-file", certs.CAFile); code != 0 {
		t.Fatalf("with the CA: exit %d: %s", code, stderr)
	}
	if code, _, stderr := runHealthcheck(t, nil, "--url", url); code != 1 || !strings.Contains(stderr, "certificate") {
		t.Fatalf("without the CA: exit %d, want 1 naming the certificate: %s", code, stderr)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runHealthcheck(t, nil, "--url", url, "--tls-ca-file", notPEM); code != 1 || !strings.Contains(stderr, "no PEM certificate") {
		t.Fatalf("bad CA file: exit %d: %s", code, stderr)
	}
	if code, _, stderr := runHealthcheck(t, nil, "--url", "http://"+addr+"/healthz", "--tls-ca-file", certs.CAFile); code != 2 {
		t.Fatalf("CA file with an http URL: exit %d, want 2: %s", code, stderr)
	}
}
