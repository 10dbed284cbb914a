package cli

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/testcerts"
	"github.com/outboxrelay/relay/internal/testlog"
)

// relayStandIn answers /metrics as the relay's handler would.
var relayStandIn = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/metrics" {
		http.NotFound(w, r)
		return
	}
	io.WriteString(w, "relay_up 1\n")
})

func httpGet(t *testing.T, c *http.Client, url string) int {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestPprofOnlyWithFlag: /debug/pprof/ is 404 unless --http-pprof is set;
// the relay's own paths are served either way.
func TestPprofOnlyWithFlag(t *testing.T) {
	for _, on := range []bool{false, true} {
		stop, addr, err := serveHTTP("127.0.0.1:0", httpHandler(relayStandIn, on), nil, testlog.New(t, 0))
		if err != nil {
			t.Fatal(err)
		}
		base := "http://" + addr
		wantPprof := http.StatusNotFound
		if on {
			wantPprof = http.StatusOK
		}
		for path, want := range map[string]int{"/debug/pprof/": wantPprof, "/debug/pprof/goroutine?debug=1": wantPprof, "/debug/pprof/cmdline": wantPprof, "/metrics": http.StatusOK} {
			if got := httpGet(t, http.DefaultClient, base+path); got != want {
				t.Errorf("pprof=%v: GET %s = %d, want %d", on, path, got, want)
			}
		}
		stop()
	}
}

// TestHTTPListenerTLS: with --http-tls-cert-file and --http-tls-key-file
// the HTTP listener serves HTTPS only; with --http-tls-client-ca-file a
// client must present a certificate the CA signed.
func TestHTTPListenerTLS(t *testing.T) {
	certs := testcerts.New(t, "prometheus")
	for _, mutual := range []bool{false, true} {
		flags := serverTLSFlags{certFile: certs.ServerCert, keyFile: certs.ServerKey}
		if mutual {
			flags.clientCAFile = certs.CAFile
		}
		cfg, err := flags.config("http")
		if err != nil {
			t.Fatal(err)
		}
		stop, addr, err := serveHTTP("127.0.0.1:0", httpHandler(relayStandIn, false), cfg, testlog.New(t, 0))
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: certs.ClientConfig(t, mutual)}}
		if got := httpGet(t, client, "https://"+addr+"/metrics"); got != http.StatusOK {
			t.Errorf("mutual=%v: GET https /metrics = %d", mutual, got)
		}
		if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("mutual=%v: plain HTTP /metrics answered 200 on the TLS listener", mutual)
			}
		}
		if mutual {
			bare := &http.Client{Transport: &http.Transport{TLSClientConfig: certs.ClientConfig(t, false)}}
			if resp, err := bare.Get("https://" + addr + "/metrics"); err == nil {
				resp.Body.Close()
				t.Errorf("GET without a client certificate = %d, want a refused handshake", resp.StatusCode)
			}
		}
		stop()
	}
	for _, bad := range []serverTLSFlags{{certFile: certs.ServerCert}, {certFile: certs.ServerKey, keyFile: certs.ServerKey}, {certFile: certs.ServerCert, keyFile: certs.ServerKey, clientCAFile: certs.ServerKey}} {
		_, err := bad.config("http")
		if err == nil {
			t.Errorf("%+v: no error", bad)
			continue
		}
		if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), certs.KeyPEM[40:80]) {
			t.Errorf("error shows the key: %v", err)
		}
	}
}
