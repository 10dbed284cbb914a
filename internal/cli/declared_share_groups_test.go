package cli_test

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
)

// TestDeclaredShareGroups runs the real binary with a config file that
// declares a share group and checks, through DescribeConfigs on the group
// resource, that the declared configs are set when the Kafka listener
// starts (and, with a franz-go share consumer, that the declared
// share.auto.offset.reset and dead-letter topic take effect), that SIGHUP sets the re-read file's values over an
// IncrementalAlterConfigs change (a config the file no longer names
// keeping its value), and that at a restart the declared values win over
// an alteration made since.
func TestDeclaredShareGroups(t *testing.T) {
	t.Parallel()
	url, bin := e2e.Migrated(t)
	httpAddr, kafkaAddr, dataDir := e2e.FreeAddr(t), e2e.FreeAddr(t), e2e.DataDir(t)
	cfgPath := filepath.Join(t.TempDir(), "relay.yaml")
	writeFile(t, cfgPath, `poll-interval: 200ms
share-groups:
  jobs:
    share.auto.offset.reset: earliest
    share.record.lock.duration.ms: 15s
    share.delivery.count.limit: 3
    share.partition.max.record.locks: 2000
    errors.deadletterqueue.topic.name: jobs.dlq
`)
	args := []string{"run", "--config", cfgPath, "--database-url", url, "--data-dir", dataDir, "--http-addr", httpAddr, "--kafka-addr", kafkaAddr}
	p := e2e.Start(t, bin, nil, args...)
	e2e.WaitReady(t, p, true, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := kafkaClient(t, kafkaAddr)

	describe := func(cl *kgo.Client) (map[string]string, error) {
		req := kmsg.NewPtrDescribeConfigsRequest()
		res := kmsg.NewDescribeConfigsRequestResource()
		res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, "jobs"
		req.Resources = append(req.Resources, res)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return nil, err
		}
		if len(resp.Resources) != 1 {
			return nil, fmt.Errorf("%d resources described", len(resp.Resources))
		}
		r := resp.Resources[0]
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return nil, err
		}
		out := map[string]string{}
		for _, c := range r.Configs {
			if c.Value != nil {
				out[c.Name] = *c.Value
			}
		}
		return out, nil
	}
	want := func(cl *kgo.Client, what string, kvs ...string) {
		t.Helper()
		eventually(t, 15*time.Second, what, func() error {
			got, err := describe(cl)
			if err != nil {
				return err
			}
			for i := 0; i < len(kvs); i += 2 {
				if got[kvs[i]] != kvs[i+1] {
					return fmt.Errorf("%s = %q, want %q (all: %v)", kvs[i], got[kvs[i]], kvs[i+1], got)
				}
			}
			return nil
		})
	}
	alter := func(kvs ...string) {
		t.Helper()
		req := kmsg.NewPtrIncrementalAlterConfigsRequest()
		res := kmsg.NewIncrementalAlterConfigsRequestResource()
		res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, "jobs"
		for i := 0; i < len(kvs); i += 2 {
			c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
			c.Name, c.Op, c.Value = kvs[i], kmsg.IncrementalAlterConfigOpSet, kmsg.StringPtr(kvs[i+1])
			res.Configs = append(res.Configs, c)
		}
		req.Resources = append(req.Resources, res)
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
		}
		if err != nil {
			t.Fatalf("IncrementalAlterConfigs: %v", err)
		}
	}

	want(cl, "the declared configs at start",
		"share.auto.offset.reset", "earliest",
		"share.record.lock.duration.ms", "15000",
		"share.delivery.count.limit", "3",
		"share.partition.max.record.locks", "2000",
		"errors.deadletterqueue.topic.name", "jobs.dlq")

	// The declared earliest and dead-letter topic at work: five outbox
	// events written before the group's first member, each received by a
	// franz-go share consumer and rejected, reach jobs.dlq.
	conn := pgtest.Connect(t, url)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload) SELECT 'jobs', 'j' || g, convert_to('job ' || g, 'UTF8') FROM generate_series(1, 5) g`); err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	t.Log("outbox drained")
	member := kafkaClient(t, kafkaAddr, kgo.ConsumeTopics("jobs"), kgo.ShareGroup("jobs"))
	for got := 0; got < 5; {
		fs := member.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("the share consumer got %d of 5 records", got)
		}
		for _, r := range fs.Records() {
			r.Ack(kgo.AckReject)
			got++
		}
		if err := member.FlushAcks(ctx); err != nil {
			t.Fatalf("flush acks: %v", err)
		}
	}
	eventually(t, 15*time.Second, "the rejected records in jobs.dlq", func() error {
		if n := len(kafkatest.ReadRecords(t, []string{kafkaAddr}, "jobs.dlq", false)); n != 5 {
			return fmt.Errorf("%d records in jobs.dlq", n)
		}
		return nil
	})
	member.Close()
	t.Log("five records rejected into jobs.dlq")

	alter("share.delivery.count.limit", "7", "share.record.lock.duration.ms", "20000")
	want(cl, "the alteration", "share.delivery.count.limit", "7", "share.record.lock.duration.ms", "20000")

	writeFile(t, cfgPath, `poll-interval: 200ms
share-groups:
  jobs:
    share.auto.offset.reset: earliest
    share.delivery.count.limit: 4
`)
	p.Signal(syscall.SIGHUP)
	want(cl, "the re-read file's values after SIGHUP",
		"share.delivery.count.limit", "4",
		"share.record.lock.duration.ms", "20000",
		"errors.deadletterqueue.topic.name", "jobs.dlq")

	alter("share.delivery.count.limit", "9", "share.auto.offset.reset", "latest")
	want(cl, "the second alteration", "share.delivery.count.limit", "9", "share.auto.offset.reset", "latest")
	t.Log("stopping the relay")
	p.Stop(30 * time.Second)

	p2 := e2e.Start(t, bin, nil, args...)
	e2e.WaitReady(t, p2, true, time.Minute)
	want(kafkaClient(t, kafkaAddr), "the declared values over the alteration at restart",
		"share.delivery.count.limit", "4",
		"share.auto.offset.reset", "earliest",
		"share.record.lock.duration.ms", "20000",
		"errors.deadletterqueue.topic.name", "jobs.dlq")
}
