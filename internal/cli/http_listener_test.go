package cli

import (
	"io"
	"net/http"
	"testing"

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
