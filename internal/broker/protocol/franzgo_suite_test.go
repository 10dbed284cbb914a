package protocol

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
)

// franzGoExpectedFailures are the tests of franz-go's pkg/kgo that are
// known to fail against the embedded broker, with why: none. Every test
// that does not skip itself passes, the KIP-848 ones included
// (Test848RegexBrokerResolves since __consumer_offsets is served
// read-only); those needing SCRAM or OAuth skip themselves on this
// broker.
var franzGoExpectedFailures = map[string]string{}

// franzGoMustPass are tests that skip themselves on a broker without a
// feature the relay serves, so a skip is a failure here: the share-group
// tests (KIP-932) skip unless ShareFetch and ShareAcknowledge v2 are
// advertised.
var franzGoMustPass = []string{"TestShareGroup", "TestShareGroupETL", "TestShareGroupAckOnClose",
	"TestShareGroupOffsetsAdmin", "TestConsumeRegexShareSkipsInternal"}

// TestFranzGoSuite runs franz-go's own integration tests (pkg/kgo, the
// version in go.mod) against a broker served here, as their README says:
// KGO_SEEDS names the broker, KGO_TEST_RF=1 a single node. It is a
// conformance suite someone else wrote: produce, consume, groups, regex
// subscriptions, transactions (TestTxnEtl, TestGroupETL), with 50,000
// records per ETL test instead of 500,000 to bound CI time: five
// transactions per producer instead of fifty, across the same rebalances
// (the full 500,000 passes too, in about 4 minutes alone on two cores,
// 6.5 with the broker under -race: more than this suite's share of CI).
func TestFranzGoSuite(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to run franz-go's suite: %v", err)
	}
	f := setupBroker(t, broker.Options{Dir: t.TempDir(), JanitorInterval: -1, TxnCheckInterval: 200 * time.Millisecond},
		func(c *Config) {
			c.MinSessionTimeout, c.InitialRebalanceDelay, c.AutoCreateTopics = 500*time.Millisecond, 100*time.Millisecond, true
		})
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "test", "-count=1", "-json", "-timeout=8m", "github.com/twmb/franz-go/pkg/kgo")
	cmd.Env = append(os.Environ(), "KGO_SEEDS="+f.addr, "KGO_TEST_RF=1", "KGO_TEST_RECORDS=50000", "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	passed, skipped, failed := map[string]bool{}, map[string]bool{}, map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev struct{ Action, Test string }
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Test == "" {
			continue
		}
		switch ev.Action {
		case "pass":
			passed[ev.Test] = true
		case "skip":
			skipped[ev.Test] = true
		case "fail":
			failed[ev.Test] = true
		}
	}
	var unexpected []string
	for name := range failed {
		if _, ok := franzGoExpectedFailures[name]; !ok {
			unexpected = append(unexpected, name)
		}
	}
	sort.Strings(unexpected)
	for name, why := range franzGoExpectedFailures {
		if passed[name] {
			t.Errorf("%s passes now; remove it from franzGoExpectedFailures (%s)", name, why)
		}
	}
	for _, name := range franzGoMustPass {
		if !passed[name] && !failed[name] {
			t.Errorf("%s did not pass (skipped: %v)", name, skipped[name])
		}
	}
	if len(unexpected) > 0 {
		t.Errorf("franz-go tests failed against the broker: %v", unexpected)
	}
	if len(passed) < 100 {
		t.Errorf("only %d franz-go tests passed (%d skipped, %d failed): the suite did not run (%v)\n%s", len(passed), len(skipped), len(failed), runErr, stderr.String())
	}
	if runErr != nil && len(unexpected) == 0 && len(failed) == 0 {
		t.Errorf("go test of franz-go: %v\n%s", runErr, stderr.String())
	}
	t.Logf("franz-go pkg/kgo against the broker: %d passed, %d skipped, %d failed", len(passed), len(skipped), len(failed))
}
