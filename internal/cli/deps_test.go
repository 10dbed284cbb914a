package cli_test

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestRelayBinaryCarriesNoHarness: the production binary links neither the
// throwaway-PostgreSQL harness of relay-dev (testcontainers, and Docker and
// OpenTelemetry's contrib instrumentation behind it) nor the test helpers.
// The OpenTelemetry API, SDK and OTLP exporters are the relay's own
// (internal/tracing).
func TestRelayBinaryCarriesNoHarness(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "../../cmd/relay").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/relay: %v\n%s", err, out)
	}
	harness := regexp.MustCompile(`testcontainers|docker|go\.opentelemetry\.io/contrib|/internal/(pgcluster|pgtest|testbin|testcerts|bench|devcli|e2e|faults)$|^testing$`)
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list -deps ./cmd/relay named only %d packages:\n%s", len(deps), out)
	}
	for _, dep := range deps {
		if harness.MatchString(dep) {
			t.Errorf("cmd/relay depends on %s", dep)
		}
	}
}
