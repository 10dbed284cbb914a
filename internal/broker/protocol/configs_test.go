package protocol

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// describeConfigs returns a topic's configs through kadm, by name.
func describeConfigs(t *testing.T, adm *kadm.Client, topic string) map[string]kadm.Config {
	t.Helper()
	rcs, err := adm.DescribeTopicConfigs(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rcs.On(topic, func(rc *kadm.ResourceConfig) error { return rc.Err })
	if err != nil {
		t.Fatalf("describing %s: %v", topic, err)
	}
	out := map[string]kadm.Config{}
	for _, c := range rc.Configs {
		out[c.Key] = c
	}
	return out
}

func wantConfig(t *testing.T, cfgs map[string]kadm.Config, name, value string, source kmsg.ConfigSource) {
	t.Helper()
	c, ok := cfgs[name]
	if !ok || c.Value == nil || *c.Value != value || c.Source != source {
		t.Errorf("%s: %+v; want %s from source %v", name, c, value, source)
	}
}

// wantAltered fails the test unless err is nil and the one topic's
// configs were altered (or, validate-only, would have been).
func wantAltered(t *testing.T, what string, resps kadm.AlterConfigsResponses, err error) {
	t.Helper()
	if err != nil || resps[0].Err != nil {
		t.Fatalf("%s: %+v, %v", what, resps, err)
	}
}

// retentionMargin gathers the server's metrics and returns group's
// margin against retention on topic/0.
func retentionMargin(t *testing.T, srv *Server, group string) (float64, bool) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(srv.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "relay_kafka_group_retention_margin_records" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "group" && l.GetValue() == group {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// TestTopicConfigsThroughKadm: kadm describes a topic's configs (overrides
// as topic configs, the rest as defaults); an incremental SET of
// retention.bytes takes effect (the janitor's pass deletes the old
// segments, the log start moves and the group's margin against retention
// with it); a legacy AlterConfigs puts what it does not name back to the
// default; bad values, unknown configs, a second cleanup policy, unknown
// topics and broker resources are refused with Kafka's codes and change
// nothing; validate-only changes nothing.
func TestTopicConfigsThroughKadm(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := testContext(t, time.Minute)
	const topic = "configured"
	if _, err := f.b.CreateTopic(topic, broker.TopicConfig{Partitions: 1, SegmentBytes: 2048, RetentionMs: -1}); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.addr), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for range 60 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, 100)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := adm.CommitAllOffsets(ctx, "readers", kadm.Offsets{topic: {0: {At: 0}}}); err != nil {
		t.Fatal(err)
	}

	cfgs := describeConfigs(t, adm, topic)
	wantConfig(t, cfgs, "retention.ms", "-1", kmsg.ConfigSourceDynamicTopicConfig)
	wantConfig(t, cfgs, "segment.bytes", "2048", kmsg.ConfigSourceDynamicTopicConfig)
	wantConfig(t, cfgs, "retention.bytes", "-1", kmsg.ConfigSourceDefaultConfig)
	wantConfig(t, cfgs, "cleanup.policy", "delete", kmsg.ConfigSourceDefaultConfig)
	if m, ok := retentionMargin(t, f.srv, "readers"); !ok || m != 0 {
		t.Fatalf("margin against retention before: %v (%v), want 0", m, ok)
	}

	refused := []struct {
		name    string
		configs []kadm.AlterConfig
		topic   string
		code    error
	}{
		{"not a number", []kadm.AlterConfig{{Name: "retention.bytes", Value: kadm.StringPtr("lots")}}, topic, kerr.InvalidConfig},
		{"unknown config", []kadm.AlterConfig{{Name: "flush.messages", Value: kadm.StringPtr("1")}}, topic, kerr.InvalidConfig},
		{"segment too small", []kadm.AlterConfig{{Name: "segment.bytes", Value: kadm.StringPtr("10")}}, topic, kerr.InvalidConfig},
		{"no policy left", []kadm.AlterConfig{{Op: kadm.SubtractConfig, Name: "cleanup.policy", Value: kadm.StringPtr("delete")}}, topic, kerr.InvalidConfig},
		{"an unknown policy", []kadm.AlterConfig{{Op: kadm.AppendConfig, Name: "cleanup.policy", Value: kadm.StringPtr("archive")}}, topic, kerr.InvalidConfig},
		{"unknown topic", []kadm.AlterConfig{{Name: "retention.bytes", Value: kadm.StringPtr("4096")}}, "nope", kerr.UnknownTopicOrPartition},
	}
	for _, r := range refused {
		resps, err := adm.AlterTopicConfigs(ctx, r.configs, r.topic)
		if err != nil {
			t.Fatal(err)
		}
		if len(resps) != 1 || !errors.Is(resps[0].Err, r.code) {
			t.Errorf("%s: %+v; want %v", r.name, resps, r.code)
		}
	}
	resps, err := adm.ValidateAlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "retention.bytes", Value: kadm.StringPtr("4096")}}, topic)
	wantAltered(t, "validate-only", resps, err)
	brokerReq := kmsg.NewPtrIncrementalAlterConfigsRequest()
	br := kmsg.NewIncrementalAlterConfigsRequestResource()
	br.ResourceType, br.ResourceName = kmsg.ConfigResourceTypeBroker, "0"
	brokerReq.Resources = append(brokerReq.Resources, br)
	if bresp, err := brokerReq.RequestWith(ctx, cl); err != nil || bresp.Resources[0].ErrorCode != kerr.InvalidRequest.Code {
		t.Errorf("altering the broker's configs: %+v, %v; want INVALID_REQUEST", bresp, err)
	}
	if got := describeConfigs(t, adm, topic); *got["retention.bytes"].Value != "-1" || *got["segment.bytes"].Value != "2048" {
		t.Fatalf("refused and validate-only changes altered the configs: %+v", got)
	}

	resps, err = adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "retention.bytes", Value: kadm.StringPtr("4096")}}, topic)
	wantAltered(t, "setting retention.bytes", resps, err)
	cfgs = describeConfigs(t, adm, topic)
	wantConfig(t, cfgs, "retention.bytes", "4096", kmsg.ConfigSourceDynamicTopicConfig)
	wantConfig(t, cfgs, "retention.ms", "-1", kmsg.ConfigSourceDynamicTopicConfig)
	if err := f.b.EnforceRetention(ctx); err != nil {
		t.Fatal(err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	start, _ := starts.Lookup(topic, 0)
	if start.Offset <= 0 {
		t.Fatalf("log start %d after a 4096-byte retention of 60 records", start.Offset)
	}
	if m, ok := retentionMargin(t, f.srv, "readers"); !ok || m != float64(-start.Offset) {
		t.Fatalf("margin against retention after: %v (%v), want %d", m, ok, -start.Offset)
	}

	// The legacy, non-incremental form replaces every config.
	resps, err = adm.AlterTopicConfigsState(ctx, []kadm.AlterConfig{{Name: "segment.ms", Value: kadm.StringPtr("3600000")}}, topic)
	wantAltered(t, "AlterConfigs", resps, err)
	cfgs = describeConfigs(t, adm, topic)
	wantConfig(t, cfgs, "segment.ms", "3600000", kmsg.ConfigSourceDynamicTopicConfig)
	wantConfig(t, cfgs, "retention.bytes", "-1", kmsg.ConfigSourceDefaultConfig)
	wantConfig(t, cfgs, "segment.bytes", strconv.FormatInt(f.b.DefaultTopicConfig().SegmentBytes, 10), kmsg.ConfigSourceDefaultConfig)

	// cleanup.policy is a list: compact is added beside delete, then
	// delete taken away.
	resps, err = adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.AppendConfig, Name: "cleanup.policy", Value: kadm.StringPtr("compact")}}, topic)
	wantAltered(t, "appending compact", resps, err)
	wantConfig(t, describeConfigs(t, adm, topic), "cleanup.policy", "delete,compact", kmsg.ConfigSourceDynamicTopicConfig)
	resps, err = adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SubtractConfig, Name: "cleanup.policy", Value: kadm.StringPtr("delete")}}, topic)
	wantAltered(t, "subtracting delete", resps, err)
	wantConfig(t, describeConfigs(t, adm, topic), "cleanup.policy", "compact", kmsg.ConfigSourceDynamicTopicConfig)
}
