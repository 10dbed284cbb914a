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
)

// TestDeclaredShareGroups runs the real binary with a config file that
// declares a share group and checks, through DescribeConfigs on the group
// resource, that the declared configs are set when the Kafka listener
// starts, that SIGHUP sets the re-read file's values over an
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
	p.Stop(30 * time.Second)

	p2 := e2e.Start(t, bin, nil, args...)
	e2e.WaitReady(t, p2, true, time.Minute)
	want(kafkaClient(t, kafkaAddr), "the declared values over the alteration at restart",
		"share.delivery.count.limit", "4",
		"share.auto.offset.reset", "earliest",
		"share.record.lock.duration.ms", "20000",
		"errors.deadletterqueue.topic.name", "jobs.dlq")
}
