package protocol

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
)

// TestEcosystemAdminClient: Debian's python3-confluent-kafka (librdkafka's
// AdminClient and Consumer, as lag exporters use them) lists topics,
// describes and alters a topic's configs, reads a group's lag, and
// deletes a topic.
func TestEcosystemAdminClient(t *testing.T) {
	t.Parallel()
	python := pythonWith(t, "confluent_kafka.admin")
	f, ctx := setupTopic(t, "orders", 2, 60*time.Second)
	f.createTopic(t, "doomed", 1)
	for i := range 14 {
		part := int32(0)
		if i >= 10 {
			part = 1
		}
		b := broker.EncodeBatch(-1, -1, -1, []broker.Record{{Value: []byte("v"), Timestamp: time.Now()}})
		if _, err := f.b.Append(ctx, "orders", part, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.b.CommitOffsets(ctx, "readers", []broker.OffsetCommit{{Topic: "orders", Partition: 0, Offset: 3}, {Topic: "orders", Partition: 1, Offset: 4}}); err != nil {
		t.Fatal(err)
	}
	script, _ := filepath.Abs("testdata/admin.py")
	cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, python, script, f.addr, "orders", "readers", "doomed")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("admin.py: %v\n%s\n%s", err, out, stderr)
	}
	var got struct {
		Topics       []string          `json:"topics"`
		Configs      map[string]string `json:"configs"`
		ConfigsAfter map[string]string `json:"configs_after"`
		Lag          map[string]int64  `json:"lag"`
		AfterDelete  []string          `json:"after_delete"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("admin.py printed %s: %v", out, err)
	}
	// list_topics includes the internal topic, as against Kafka.
	if !slices.Equal(got.Topics, []string{"__consumer_offsets", "doomed", "orders"}) {
		t.Errorf("topics: %v", got.Topics)
	}
	if got.Configs["retention.ms"] != "604800000" || got.Configs["cleanup.policy"] != "delete" {
		t.Errorf("configs: %v", got.Configs)
	}
	if got.ConfigsAfter["retention.ms"] != "3600000" {
		t.Errorf("configs after alter_configs: %v", got.ConfigsAfter)
	}
	if ti, _ := f.b.Topic("orders"); ti.Config.RetentionMs != 3600000 {
		t.Errorf("the broker's retention.ms after alter_configs: %d", ti.Config.RetentionMs)
	}
	if got.Lag["0"] != 7 || got.Lag["1"] != 0 {
		t.Errorf("lag: %v, want 7 and 0", got.Lag)
	}
	if !slices.Equal(got.AfterDelete, []string{"__consumer_offsets", "orders"}) {
		t.Errorf("topics after delete_topics: %v", got.AfterDelete)
	}
}
