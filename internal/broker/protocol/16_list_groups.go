package protocol

import (
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleList lists live groups and groups known only by committed offsets
// (those are Empty), filtered by state on v4+.
func (c *coordinator) handleList(req *kmsg.ListGroupsRequest) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.ListGroupsResponse)
	seen := map[string]bool{}
	add := func(id, protocolType, state string) {
		seen[id] = true
		if len(req.StatesFilter) > 0 && !slices.ContainsFunc(req.StatesFilter, func(f string) bool { return strings.EqualFold(f, state) }) {
			return
		}
		lg := kmsg.NewListGroupsResponseGroup()
		lg.Group, lg.ProtocolType, lg.GroupState, lg.GroupType = id, protocolType, state, "classic"
		resp.Groups = append(resp.Groups, lg)
	}
	for _, g := range c.snapshot() {
		g.mu.Lock()
		if g.state != groupDead {
			add(g.id, g.protocolType, g.state.String())
		}
		g.mu.Unlock()
	}
	for _, id := range c.s.b.Groups() {
		if !seen[id] {
			add(id, c.savedProtocolType(id), groupEmpty.String())
		}
	}
	slices.SortFunc(resp.Groups, func(a, b kmsg.ListGroupsResponseGroup) int { return strings.Compare(a.Group, b.Group) })
	return resp
}
