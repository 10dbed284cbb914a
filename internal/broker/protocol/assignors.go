package protocol

import (
	"maps"
	"slices"
)

// The server-side assignors of KIP-848 consumer groups. Both take each
// member's subscribed topics (existing ones, sorted) and the partition
// counts of the subscribed topics, and return every member's target.

// assignRange is Kafka's range assignor: for each topic, its partitions
// are split into contiguous ranges over the members subscribing to it, in
// member id order, the first members getting one more when the count does
// not divide.
func assignRange(subs map[string][]string, counts map[string]int32) map[string]assignment {
	out := make(map[string]assignment, len(subs))
	byTopic := map[string][]string{}
	for id, topics := range subs {
		out[id] = assignment{}
		for _, t := range topics {
			byTopic[t] = append(byTopic[t], id)
		}
	}
	for t, ids := range byTopic {
		slices.Sort(ids)
		n := int(counts[t])
		per, extra := n/len(ids), n%len(ids)
		p := int32(0)
		for i, id := range ids {
			k := per
			if i < extra {
				k++
			}
			for range k {
				out[id].add(t, p)
				p++
			}
		}
	}
	return out
}

// assignUniform is a uniform assignor: every partition of a subscribed
// topic goes to one subscribing member, the members' counts differ by at
// most one where their subscriptions allow it, and a partition stays with
// the member prev gave it to unless balance needs it elsewhere (sticky,
// so a rebalance moves as few partitions as it can).
func assignUniform(subs map[string][]string, counts map[string]int32, prev map[string]assignment) map[string]assignment {
	out := make(map[string]assignment, len(subs))
	ids := make([]string, 0, len(subs))
	for id := range subs {
		out[id] = assignment{}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	subscribes := func(id, t string) bool {
		_, ok := slices.BinarySearch(subs[id], t)
		return ok
	}
	var parts []topicPart
	for _, t := range slices.Sorted(maps.Keys(counts)) {
		for p := range counts[t] {
			parts = append(parts, topicPart{t, p})
		}
	}
	owner := map[topicPart]string{}
	n := map[string]int{}
	// Eligible members per partition, for the balancing below.
	eligible := func(tp topicPart) []string {
		var es []string
		for _, id := range ids {
			if subscribes(id, tp.topic) {
				es = append(es, id)
			}
		}
		return es
	}
	// Quota: with everyone subscribing to everything, no member needs
	// more than ceil(partitions/members); keep at most that many of the
	// previous ones.
	quota := len(parts)
	if len(ids) > 0 {
		quota = (len(parts) + len(ids) - 1) / len(ids)
	}
	for _, id := range ids {
		prev[id].each(func(t string, p int32) {
			tp := topicPart{t, p}
			if _, exists := counts[t]; !exists || p >= counts[t] || !subscribes(id, t) || n[id] >= quota {
				return
			}
			if _, taken := owner[tp]; !taken {
				owner[tp], n[id] = id, n[id]+1
			}
		})
	}
	for _, tp := range parts {
		if _, ok := owner[tp]; ok {
			continue
		}
		best := ""
		for _, id := range eligible(tp) {
			if best == "" || n[id] < n[best] {
				best = id
			}
		}
		if best != "" {
			owner[tp], n[best] = best, n[best]+1
		}
	}
	// Move partitions from the fullest to the emptiest eligible member
	// until no move narrows the gap (each move lowers the sum of squared
	// counts, so this ends).
	for moved := true; moved; {
		moved = false
		for _, tp := range parts {
			from, ok := owner[tp]
			if !ok {
				continue
			}
			for _, id := range eligible(tp) {
				if n[id]+1 < n[from] {
					owner[tp], n[from], n[id] = id, n[from]-1, n[id]+1
					moved = true
					break
				}
			}
		}
	}
	for tp, id := range owner {
		out[id].add(tp.topic, tp.partition)
	}
	return out
}
