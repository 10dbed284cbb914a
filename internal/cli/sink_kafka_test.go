package cli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/testbin"
)

// TestKafkaSinkFlagsCheckedBeforeConversion: a --kafka-* number too
// large for its Kafka field is refused with its flag's name and exit 2,
// not wrapped into another value (2^32+512 would have become 512, which
// the sink accepts).
func TestKafkaSinkFlagsCheckedBeforeConversion(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ flag, value string }{
		{"--kafka-batch-max-bytes", "4294967808"},
		{"--kafka-topic-partitions", "4294967297"},
		{"--kafka-topic-replication-factor", "65539"},
	} {
		r, err := testbin.Run(context.Background(), testbin.Relay(t), nil, "run", "--sink", "kafka", "--kafka-brokers", "127.0.0.1:1",
			c.flag, c.value, "--database-url", "postgres://127.0.0.1:1/none", "--http-addr", "")
		if err != nil || r.Code != 2 || !strings.Contains(r.Stderr, c.flag+" "+c.value) || strings.Count(strings.TrimSpace(r.Stderr), "\n") > 0 {
			t.Errorf("%s %s: %v, exit %d, stderr %q; want exit 2 and one line naming the flag", c.flag, c.value, err, r.Code, r.Stderr)
		}
	}
}
