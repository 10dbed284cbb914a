package cli_test

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/broker/protocol"
)

// TestGroupsShowsShareGroups: `relay groups` lists a share group with its
// live member (from the listener), its share start offset, the records in
// flight and the lag, from the data directory of a running broker.
func TestGroupsShowsShareGroups(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	b, err := broker.Open(ctx, broker.Options{Dir: dir, JanitorInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := protocol.NewServer(b, protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln) }()
	defer func() {
		stop()
		<-served
		_ = srv.Close()
		_ = b.Close()
	}()
	if _, err := b.CreateTopic("jobs", broker.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := b.Append(ctx, "jobs", 0, broker.EncodeBatch(-1, -1, -1, []broker.Record{{Value: []byte("job")}})); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(ln.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	do := func(req kmsg.Request) kmsg.Response {
		t.Helper()
		resp, err := cl.Request(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	alter := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, "workers"
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value = "share.auto.offset.reset", kmsg.StringPtr("earliest")
	res.Configs = append(res.Configs, c)
	alter.Resources = append(alter.Resources, res)
	if code := do(alter).(*kmsg.IncrementalAlterConfigsResponse).Resources[0].ErrorCode; code != 0 {
		t.Fatal(kerr.ErrorForCode(code))
	}
	hb := kmsg.NewPtrShareGroupHeartbeatRequest()
	hb.GroupID, hb.MemberID, hb.SubscribedTopicNames = "workers", "member-1", []string{"jobs"}
	hbResp := do(hb).(*kmsg.ShareGroupHeartbeatResponse)
	if hbResp.ErrorCode != 0 || hbResp.Assignment == nil || len(hbResp.Assignment.TopicPartitions) != 1 {
		t.Fatalf("heartbeat: %v %+v", kerr.ErrorForCode(hbResp.ErrorCode), hbResp.Assignment)
	}
	id := hbResp.Assignment.TopicPartitions[0].TopicID
	group, member := "workers", "member-1"
	fetch := func(epoch int32, acceptTo int64) {
		t.Helper()
		req := kmsg.NewPtrShareFetchRequest()
		req.GroupID, req.MemberID, req.ShareSessionEpoch, req.MaxRecords, req.MaxBytes = &group, &member, epoch, 100, 1<<20
		rt := kmsg.NewShareFetchRequestTopic()
		rt.TopicID = id
		rp := kmsg.NewShareFetchRequestTopicPartition()
		rp.PartitionMaxBytes = 1 << 20
		if acceptTo >= 0 {
			ab := kmsg.NewShareFetchRequestTopicPartitionAcknowledgementBatch()
			ab.FirstOffset, ab.LastOffset, ab.AcknowledgeTypes = 0, acceptTo, []int8{1}
			rp.AcknowledgementBatches = append(rp.AcknowledgementBatches, ab)
		}
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := cl.Broker(0).RetriableRequest(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if code := resp.(*kmsg.ShareFetchResponse).ErrorCode; code != 0 {
			t.Fatal(kerr.ErrorForCode(code))
		}
	}
	fetch(0, -1) // acquires offsets 0-9
	fetch(1, 3)  // accepts 0-3

	var gs []struct {
		Group   string `json:"group"`
		Type    string `json:"type"`
		State   string `json:"state"`
		Members []struct {
			MemberID string `json:"member_id"`
		}
		Partitions []struct {
			Topic     string `json:"topic"`
			Committed int64  `json:"committed"`
			InFlight  int    `json:"in_flight"`
			Lag       int64  `json:"lag"`
		} `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(succeeds(t, "groups", "--json", "--data-dir", dir, "--kafka-addr", ln.Addr().String())), &gs); err != nil {
		t.Fatal(err)
	}
	if len(gs) != 1 || gs[0].Group != "workers" || gs[0].Type != "share" || gs[0].State != "Stable" || len(gs[0].Members) != 1 ||
		len(gs[0].Partitions) != 1 || gs[0].Partitions[0].Committed != 4 || gs[0].Partitions[0].InFlight != 6 || gs[0].Partitions[0].Lag != 6 {
		t.Fatalf("relay groups --json: %+v; want share group workers, Stable, 1 member, start 4, 6 in flight, lag 6", gs)
	}
	if out := succeeds(t, "groups", "--data-dir", dir, "--kafka-addr", ln.Addr().String()); !strings.Contains(out, "share group workers: Stable, 1 members, lag 6") {
		t.Fatalf("relay groups: %s", out)
	}
}
