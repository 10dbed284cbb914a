package protocol

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// seedRequests are well-formed requests of every supported API, the
// starting points of FuzzRequest (testdata/fuzz/FuzzRequest holds them
// and more, encoded).
func seedRequests() []kmsg.Request {
	topic := "fuzz"
	var reqs []kmsg.Request
	for key, vr := range supportedVersions {
		for _, v := range []int16{vr.min, vr.max} {
			req := kmsg.RequestForKey(key)
			req.SetVersion(v)
			switch r := req.(type) {
			case *kmsg.ProduceRequest:
				r.Acks = -1
				rt := kmsg.NewProduceRequestTopic()
				rt.Topic = topic
				rp := kmsg.NewProduceRequestTopicPartition()
				rp.Records = broker.EncodeBatch(-1, -1, -1, []broker.Record{{Key: []byte("k"), Value: []byte("v")}})
				rt.Partitions = append(rt.Partitions, rp)
				r.Topics = append(r.Topics, rt)
			case *kmsg.FetchRequest:
				r.MaxWaitMillis, r.MinBytes, r.MaxBytes, r.SessionEpoch = 10, 1, 1<<20, -1
				rt := kmsg.NewFetchRequestTopic()
				rt.Topic = topic
				rp := kmsg.NewFetchRequestTopicPartition()
				rp.PartitionMaxBytes = 1 << 20
				rt.Partitions = append(rt.Partitions, rp)
				r.Topics = append(r.Topics, rt)
			case *kmsg.MetadataRequest:
				rt := kmsg.NewMetadataRequestTopic()
				rt.Topic = &topic
				r.Topics = append(r.Topics, rt)
			case *kmsg.ListOffsetsRequest:
				r.Topics = append(r.Topics, latestOffsetTopic(topic))
			case *kmsg.JoinGroupRequest:
				r.Group, r.SessionTimeoutMillis, r.RebalanceTimeoutMillis, r.ProtocolType = "g", 6000, 6000, "consumer"
				r.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: []byte{0, 1}}}
			case *kmsg.SyncGroupRequest:
				r.Group, r.MemberID = "g", "m"
			case *kmsg.HeartbeatRequest:
				r.Group, r.MemberID = "g", "m"
			case *kmsg.LeaveGroupRequest:
				r.Group, r.MemberID = "g", "m"
				r.Members = []kmsg.LeaveGroupRequestMember{{MemberID: "m"}}
			case *kmsg.OffsetCommitRequest:
				r.Group, r.Generation = "g", -1
				rt := kmsg.NewOffsetCommitRequestTopic()
				rt.Topic = topic
				rt.Partitions = []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: 1}}
				r.Topics = append(r.Topics, rt)
			case *kmsg.OffsetFetchRequest:
				r.Group = "g"
				r.Groups = []kmsg.OffsetFetchRequestGroup{{Group: "g"}}
			case *kmsg.FindCoordinatorRequest:
				r.CoordinatorKey = "g"
				r.CoordinatorKeys = []string{"g"}
			case *kmsg.DescribeGroupsRequest:
				r.Groups = []string{"g"}
			case *kmsg.CreateTopicsRequest:
				rt := kmsg.NewCreateTopicsRequestTopic()
				rt.Topic, rt.NumPartitions, rt.ReplicationFactor = "created", 1, 1
				r.Topics = append(r.Topics, rt)
			}
			reqs = append(reqs, req)
		}
	}
	return reqs
}

// FuzzRequest feeds arbitrary frames to the decoder and every decoded
// request to its handler and the response encoder: nothing may panic.
func FuzzRequest(f *testing.F) {
	for i, req := range seedRequests() {
		f.Add(encodeRequest(int32(i), req)[4:])
	}
	fx := setup(f, func(c *Config) { c.AutoCreateTopics = false })
	fx.createTopic(f, "fuzz", 2)
	client, server := net.Pipe()
	f.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	c := &conn{s: fx.srv, nc: server}

	f.Fuzz(func(t *testing.T, frame []byte) {
		r := decodeRequest(frame)
		if r.err != nil {
			return
		}
		resp := r.resp
		if resp == nil {
			if _, ok := r.req.(*kmsg.CreateTopicsRequest); ok {
				// Handled alike, but creating up to 100000 partitions
				// per input would fill the disk, not find bugs.
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			start := time.Now()
			var (
				wait, release func()
				err           error
			)
			resp, wait, release, err = fx.srv.handle(ctx, c, r)
			if wait != nil {
				wait()
			}
			if release != nil {
				defer release()
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Fatalf("%s v%d took %v despite a 20ms context", kmsg.NameForKey(r.key), r.version, took)
			}
			if err != nil || resp == nil {
				return
			}
		}
		if resp.Key() != r.key {
			t.Fatalf("response key %d for request key %d", resp.Key(), r.key)
		}
		resp.AppendTo(nil)
	})
}
