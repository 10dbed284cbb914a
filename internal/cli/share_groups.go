package cli

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/broker/protocol"
)

// shareGroups is `relay groups`' view of the share groups saved in
// dataDir: per partition the share start offset (as Committed), the
// records in flight and the lag (the log past the share end offset plus
// the records in flight); members come from the Kafka listener at addr.
func shareGroups(ctx context.Context, dataDir, addr string, ins broker.Inspection) ([]groupJSON, error) {
	saved, err := protocol.SavedShareGroups(dataDir)
	if err != nil {
		return nil, err
	}
	logs := map[string]broker.PartitionInfo{}
	for _, t := range ins.Topics {
		for _, p := range t.Partitions {
			logs[fmt.Sprintf("%s/%d", t.Name, p.Partition)] = p
		}
	}
	out := make([]groupJSON, 0, len(saved))
	names := make([]string, 0, len(saved))
	for _, sg := range saved {
		gj := groupJSON{Group: sg.Group, Type: "share", Members: []memberJSON{}, Partitions: []groupPartition{}}
		for _, p := range sg.Partitions {
			lp := logs[fmt.Sprintf("%s/%d", p.Topic, p.Partition)]
			gp := groupPartition{Topic: p.Topic, Partition: p.Partition, Committed: p.Start, StartOffset: lp.LogStartOffset,
				EndOffset: lp.LogEndOffset, InFlight: p.InFlight, RetentionMargin: p.Start - lp.LogStartOffset, BelowLogStart: p.Start < lp.LogStartOffset}
			gp.Lag = max(lp.LogEndOffset-p.End, 0) + int64(p.InFlight)
			gj.Lag += gp.Lag
			gj.Partitions = append(gj.Partitions, gp)
		}
		out = append(out, gj)
		names = append(names, sg.Group)
	}
	if addr != "" && len(names) > 0 {
		describeShareMembers(ctx, addr, names, out)
	}
	return out, nil
}

// describeShareMembers fills the live state and members of share groups
// from the Kafka listener (ShareGroupDescribe); one that does not answer
// leaves them empty.
func describeShareMembers(ctx context.Context, addr string, names []string, out []groupJSON) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DialTimeout(time.Second), kgo.RetryTimeout(2*time.Second))
	if err != nil {
		return
	}
	defer cl.Close()
	req := kmsg.NewPtrShareGroupDescribeRequest()
	req.GroupIDs = names
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return
	}
	byID := map[string]kmsg.ShareGroupDescribeResponseGroup{}
	for _, g := range resp.Groups {
		byID[g.GroupID] = g
	}
	for i := range out {
		g, ok := byID[out[i].Group]
		if !ok || g.ErrorCode != 0 {
			continue
		}
		out[i].State = g.GroupState
		for _, m := range g.Members {
			mj := memberJSON{MemberID: m.MemberID, ClientID: m.ClientID, ClientHost: m.ClientHost, Assigned: []string{}}
			for _, t := range m.Assignment.TopicPartitions {
				for _, p := range t.Partitions {
					mj.Assigned = append(mj.Assigned, fmt.Sprintf("%s/%d", t.Topic, p))
				}
			}
			sort.Strings(mj.Assigned)
			out[i].Members = append(out[i].Members, mj)
		}
	}
}
