package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/outboxrelay/relay/internal/bench"
)

// LatencyQuantile reads the relay's publish-latency histogram (from an
// event's INSERT to its durable acknowledgement) at addr and returns its q
// quantile and the number of events it counts.
func LatencyQuantile(t testing.TB, addr string, q float64) (time.Duration, uint64) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scraping metrics: %v", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing metrics: %v", err)
	}
	f := families["relay_publish_latency_seconds"]
	if f == nil || len(f.Metric) == 0 {
		t.Fatal("no publish latency histogram")
	}
	h := f.Metric[0].GetHistogram()
	return bench.Quantile(h, q), h.GetSampleCount()
}
