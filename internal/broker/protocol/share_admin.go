package protocol

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// The share groups' admin side: DescribeShareGroupOffsets,
// AlterShareGroupOffsets, DeleteShareGroupOffsets, and the share groups'
// part of DeleteGroups and ListGroups.

// shareLag is what a share partition has left to deliver: the log past
// its end offset plus the records in flight.
func shareLag(sp *sharePartition, hwm int64) int64 {
	return max(hwm-sp.end, 0) + int64(len(sp.recs))
}

// handleDescribeShareGroupOffsets reports each share partition's start
// offset and lag: the partitions asked, or all the group has state for
// (Topics null). A partition without state has start offset -1.
func (sc *shareCoordinator) handleDescribeShareGroupOffsets(req *kmsg.DescribeShareGroupOffsetsRequest, resp *kmsg.DescribeShareGroupOffsetsResponse) {
	for _, rg := range req.Groups {
		g := kmsg.NewDescribeShareGroupOffsetsResponseGroup()
		g.GroupID = rg.GroupID
		parts := map[topicPart]*sharePartition{}
		sg := sc.group(rg.GroupID, false)
		if sg != nil {
			sg.mu.Lock()
			parts = sg.parts
		}
		want := map[string][]int32{}
		if rg.Topics == nil {
			for tp := range parts {
				want[tp.topic] = append(want[tp.topic], tp.partition)
			}
		}
		for _, rt := range rg.Topics {
			want[rt.Topic] = append(want[rt.Topic], rt.Partitions...)
		}
		for _, name := range slices.Sorted(maps.Keys(want)) {
			t := kmsg.NewDescribeShareGroupOffsetsResponseGroupTopic()
			t.Topic, t.TopicID = name, topicID(name)
			ps := want[name]
			slices.Sort(ps)
			for _, p := range slices.Compact(ps) {
				rp := kmsg.NewDescribeShareGroupOffsetsResponseGroupTopicPartition()
				rp.Partition, rp.StartOffset, rp.LeaderEpoch, rp.Lag = p, -1, 0, -1
				_, hwm, err := sc.s.b.Offsets(name, p)
				switch sp := parts[topicPart{topic: name, partition: p}]; {
				case err != nil:
					rp.ErrorCode = broker.KafkaErrorCode(err)
				case sp != nil:
					rp.StartOffset, rp.Lag = sp.start, shareLag(sp, hwm)
				}
				t.Partitions = append(t.Partitions, rp)
			}
			g.Topics = append(g.Topics, t)
		}
		if sg != nil {
			sg.mu.Unlock()
		}
		resp.Groups = append(resp.Groups, g)
	}
}

// handleAlterShareGroupOffsets sets share partitions' start offsets of a
// group without members (creating it): nothing below the offset is
// delivered, everything from it is, once.
func (sc *shareCoordinator) handleAlterShareGroupOffsets(req *kmsg.AlterShareGroupOffsetsRequest, resp *kmsg.AlterShareGroupOffsetsResponse) {
	if sc.s.groups.isOtherType(req.GroupID) {
		resp.ErrorCode = kerr.GroupIDNotFound.Code
		return
	}
	g := sc.group(req.GroupID, true)
	if g == nil {
		resp.ErrorCode = kerr.CoordinatorNotAvailable.Code
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.members) > 0 {
		resp.ErrorCode = kerr.NonEmptyGroup.Code
		msg := fmt.Sprintf("share group %s has members", g.id)
		resp.ErrorMessage = &msg
		return
	}
	for _, rt := range req.Topics {
		t := kmsg.NewAlterShareGroupOffsetsResponseTopic()
		t.Topic, t.TopicID = rt.Topic, topicID(rt.Topic)
		for _, rp := range rt.Partitions {
			p := kmsg.NewAlterShareGroupOffsetsResponseTopicPartition()
			p.Partition = rp.Partition
			earliest, hwm, err := sc.s.b.Offsets(rt.Topic, rp.Partition)
			switch {
			case err != nil:
				p.ErrorCode = broker.KafkaErrorCode(err)
			case rp.StartOffset < 0 || rp.StartOffset > hwm:
				p.ErrorCode = kerr.InvalidRequest.Code
				msg := fmt.Sprintf("start offset %d is outside the log [%d, %d]", rp.StartOffset, earliest, hwm)
				p.ErrorMessage = &msg
			default:
				at := max(rp.StartOffset, earliest)
				g.parts[topicPart{topic: rt.Topic, partition: rp.Partition}] = &sharePartition{start: at, end: at, recs: map[int64]*shareRec{}}
			}
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
	sc.persist(g)
}

// handleDeleteShareGroupOffsets forgets a member-less group's share state
// of the topics named; a later member starts them afresh at
// share.auto.offset.reset.
func (sc *shareCoordinator) handleDeleteShareGroupOffsets(req *kmsg.DeleteShareGroupOffsetsRequest, resp *kmsg.DeleteShareGroupOffsetsResponse) {
	g := sc.group(req.GroupID, false)
	if g == nil {
		resp.ErrorCode = kerr.GroupIDNotFound.Code
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.members) > 0 {
		resp.ErrorCode = kerr.NonEmptyGroup.Code
		msg := fmt.Sprintf("share group %s has members", g.id)
		resp.ErrorMessage = &msg
		return
	}
	for _, rt := range req.Topics {
		t := kmsg.NewDeleteShareGroupOffsetsResponseTopic()
		t.Topic, t.TopicID = rt.Topic, topicID(rt.Topic)
		if _, err := sc.s.b.Topic(rt.Topic); err != nil {
			t.ErrorCode = broker.KafkaErrorCode(err)
		}
		for tp := range g.parts {
			if tp.topic == rt.Topic {
				delete(g.parts, tp)
			}
		}
		resp.Topics = append(resp.Topics, t)
	}
	sc.persist(g)
}

// deleteGroup deletes a share group without members and its saved state;
// ok is false when id is no share group.
func (sc *shareCoordinator) deleteGroup(id string) (ok bool, code int16, err error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	g := sc.groups[id]
	if g == nil {
		return false, 0, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.members) > 0 {
		return true, kerr.NonEmptyGroup.Code, fmt.Errorf("share group %s has members", id)
	}
	if err := sc.deleteState(id); err != nil {
		return true, kerr.KafkaStorageError.Code, err
	}
	delete(sc.groups, id)
	return true, 0, nil
}

// listed adds the share groups to a ListGroups response.
func (sc *shareCoordinator) listed(add func(id, protocolType, state, groupType string)) {
	sc.mu.Lock()
	groups := make([]*shareGroup, 0, len(sc.groups))
	for _, g := range sc.groups {
		groups = append(groups, g)
	}
	sc.mu.Unlock()
	slices.SortFunc(groups, func(a, b *shareGroup) int { return strings.Compare(a.id, b.id) })
	for _, g := range groups {
		g.mu.Lock()
		state := "Empty"
		if len(g.members) > 0 {
			state = "Stable"
		}
		g.mu.Unlock()
		add(g.id, "share", state, "share")
	}
}
