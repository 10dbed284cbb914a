package protocol

import (
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleList lists live groups and groups known only by committed offsets
// (those are Empty), filtered by state on v4+ and by type (classic or
// consumer, KIP-848) on v5+.
func (c *coordinator) handleList(req *kmsg.ListGroupsRequest, resp *kmsg.ListGroupsResponse) {
	seen := map[string]bool{}
	add := func(id, protocolType, state, groupType string) {
		seen[id] = true
		if len(req.StatesFilter) > 0 && !slices.ContainsFunc(req.StatesFilter, func(f string) bool { return strings.EqualFold(f, state) }) {
			return
		}
		if len(req.TypesFilter) > 0 && !slices.ContainsFunc(req.TypesFilter, func(f string) bool { return strings.EqualFold(f, groupType) }) {
			return
		}
		lg := kmsg.NewListGroupsResponseGroup()
		lg.Group, lg.ProtocolType, lg.GroupState, lg.GroupType = id, protocolType, state, groupType
		resp.Groups = append(resp.Groups, lg)
	}
	for _, g := range c.snapshot() {
		g.mu.Lock()
		if g.state != groupDead {
			add(g.id, g.protocolType, g.state.String(), "classic")
		}
		g.mu.Unlock()
	}
	for _, g := range c.consumerSnapshot() {
		g.mu.Lock()
		if !g.dead {
			add(g.id, consumerProtocolType, g.state(), groupTypeConsumer)
		}
		g.mu.Unlock()
	}
	c.s.share.listed(add)
	for _, id := range c.s.b.Groups() {
		if !seen[id] {
			add(id, c.savedProtocolType(id), groupEmpty.String(), c.savedGroupType(id))
		}
	}
	slices.SortFunc(resp.Groups, func(a, b kmsg.ListGroupsResponseGroup) int { return strings.Compare(a.Group, b.Group) })
}
