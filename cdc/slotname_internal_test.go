package cdc

import (
	"strings"
	"testing"
)

// TestDefaultSlotName: the default names the schema and the database's
// oid, stays a valid slot name (a hash replaces a schema too long to fit),
// and differs between (schema, database) pairs.
func TestDefaultSlotName(t *testing.T) {
	if got := defaultSlotName("outbox", 16384); got != "relay_outbox_16384" {
		t.Errorf("defaultSlotName(outbox, 16384) = %q", got)
	}
	long1, long2 := strings.Repeat("a", 63), strings.Repeat("a", 62)+"b"
	seen := map[string]bool{}
	for _, c := range []struct {
		schema string
		oid    uint32
	}{{"outbox", 16384}, {"outbox", 16385}, {"outbox_1", 6384}, {long1, 4294967295}, {long2, 4294967295}, {long1, 1}} {
		name := defaultSlotName(c.schema, c.oid)
		if !namePattern.MatchString(name) {
			t.Errorf("defaultSlotName(%s, %d) = %q: not a valid slot name", c.schema, c.oid, name)
		}
		if seen[name] {
			t.Errorf("defaultSlotName(%s, %d) = %q, the name of another pair", c.schema, c.oid, name)
		}
		seen[name] = true
	}
}
