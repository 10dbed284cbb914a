package monitoring_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// exported returns the metric families a relay's /metrics at addr has
// samples of (histograms by their _bucket, _sum and _count series).
func exported(t *testing.T, addr string) map[string]bool {
	names := map[string]bool{}
	for _, line := range e2e.MetricLines(t, addr) {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		names[name] = true
	}
	return names
}

// TestMetricsExist runs the real binary with the WAL reader and makes
// every conditional metric family appear: events published and consumed
// by a group that commits, an event the core dead-letters (it sets a
// relay- header), a pipeline restart (its Postgres sessions terminated),
// a share group member's fetch, and last an event for a topic the broker does not have (with
// --create-topics=false it waits, and everything behind it). Then every relay metric the alert rules and the
// dashboard name must be on /metrics: a renamed or removed metric fails
// here, not silently in production.
func TestMetricsExist(t *testing.T) {
	t.Parallel()
	used := namedMetrics(t)
	url, bin := e2e.Migrated(t)
	httpAddr, kafkaAddr := e2e.FreeAddr(t), e2e.FreeAddr(t)
	p := e2e.Start(t, bin, nil, "run", "--source", "cdc", "--database-url", url, "--data-dir", e2e.DataDir(t),
		"--http-addr", httpAddr, "--kafka-addr", kafkaAddr, "--create-topics=false")
	e2e.WaitReady(t, p, true, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr), kgo.ConsumerGroup("monitoring"), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	created, err := kadm.NewClient(cl).CreateTopics(ctx, 2, 1, nil, "orders")
	if err == nil {
		err = created.Error()
	}
	if err != nil {
		t.Fatalf("creating orders: %v", err)
	}

	conn := pgtest.Connect(t, url)
	for _, q := range []string{
		`INSERT INTO outbox.events (topic, key, payload) SELECT 'orders', 'k' || g, 'v' FROM generate_series(1, 20) AS g`,
		`INSERT INTO outbox.events (topic, key, payload, headers) VALUES ('orders', 'forged', 'v', '{"relay-event-id": "forged"}')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for got := 0; got < 20; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of 20 events: %v", got, err)
		}
		got += fs.NumRecords()
	}
	if err := cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("committing the group's offsets: %v", err)
	}
	shareFetch(ctx, t, cl, "orders")
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	// Last: the whole pipeline waits behind it.
	if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ('not-created', 'k', 'v')`); err != nil {
		t.Fatal(err)
	}

	var missing []string
	for {
		names := exported(t, httpAddr)
		missing = missing[:0]
		for m := range used {
			if !names[m] {
				missing = append(missing, m)
			}
		}
		if len(missing) == 0 {
			return
		}
		if ctx.Err() != nil {
			sort.Strings(missing)
			for _, m := range missing {
				t.Errorf("%s, used by %s, is not on /metrics", m, strings.Join(used[m], ", "))
			}
			t.Fatalf("relay output:\n%s", p.Output())
		}
		time.Sleep(500 * time.Millisecond) // condition poll: /metrics of another process
	}
}

// shareFetch joins the share group "monitoring-share" (KIP-932) with a
// member subscribed to topic and share-fetches its partitions once, which
// gives the group share partitions (and so its lag and acquired-records
// series).
func shareFetch(ctx context.Context, t *testing.T, cl *kgo.Client, topic string) {
	t.Helper()
	topics, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	td, ok := topics[topic]
	if !ok || td.Err != nil {
		t.Fatalf("metadata of %s: %v", topic, td.Err)
	}
	group, member := "monitoring-share", "monitoring-member"
	hb := kmsg.NewPtrShareGroupHeartbeatRequest()
	hb.GroupID, hb.MemberID, hb.SubscribedTopicNames = group, member, []string{topic}
	hbResp, err := hb.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(hbResp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("share group heartbeat: %v", err)
	}
	req := kmsg.NewPtrShareFetchRequest()
	req.GroupID, req.MemberID, req.MaxRecords = &group, &member, 10
	rt := kmsg.NewShareFetchRequestTopic()
	rt.TopicID = td.ID
	for p := range td.Partitions {
		rp := kmsg.NewShareFetchRequestTopicPartition()
		rp.Partition = p
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("share fetch: %v", err)
	}
}
