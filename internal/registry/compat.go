package registry

import (
	"fmt"
	"strings"
)

// Compatibility levels: which earlier versions a new version is checked
// against, and in which direction. BACKWARD: consumers using the new
// schema read data written with the old one. FORWARD: consumers still on
// the old schema read data written with the new one. FULL: both. The
// TRANSITIVE forms check every earlier version, the others only the
// latest. NONE checks nothing.
const (
	Backward           = "BACKWARD"
	BackwardTransitive = "BACKWARD_TRANSITIVE"
	Forward            = "FORWARD"
	ForwardTransitive  = "FORWARD_TRANSITIVE"
	Full               = "FULL"
	FullTransitive     = "FULL_TRANSITIVE"
	None               = "NONE"
)

// DefaultCompatibility is the level of a subject without its own and of a
// registry without a global one. FULL_TRANSITIVE is the rule events live
// by: a consumer may be on any earlier version (events outlive the code
// that wrote them) and a producer may be older than its consumers, so a
// new version must read, and be readable by, every version before it.
// In practice: add fields only with defaults, remove only fields that have
// defaults, never change a field's type.
const DefaultCompatibility = FullTransitive

// ParseLevel checks a compatibility level's name.
func ParseLevel(s string) (string, error) {
	switch l := strings.ToUpper(s); l {
	case Backward, BackwardTransitive, Forward, ForwardTransitive, Full, FullTransitive, None:
		return l, nil
	}
	return "", fmt.Errorf("unknown compatibility level %q (BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL, FULL_TRANSITIVE or NONE)", s)
}

// Checked is one earlier version a new schema is compared with.
type Checked struct {
	Version int
	Schema  Schema
}

// Check lists why next may not follow earlier (oldest first) under level.
// Each violation's message says with which version and in which direction
// it breaks; one that breaks both ways is listed once.
func Check(level string, next Schema, earlier []Checked) []Violation {
	if level == None || len(earlier) == 0 {
		return nil
	}
	against := earlier
	if !strings.HasSuffix(level, "_TRANSITIVE") {
		against = earlier[len(earlier)-1:]
	}
	backward := strings.HasPrefix(level, "BACKWARD") || strings.HasPrefix(level, "FULL")
	forward := strings.HasPrefix(level, "FORWARD") || strings.HasPrefix(level, "FULL")
	type key struct {
		v       Violation
		version int
	}
	var order []key
	dirs := map[key]int{}
	note := func(vs []Violation, version, dir int) {
		for _, v := range vs {
			k := key{v, version}
			if dirs[k] == 0 {
				order = append(order, k)
			}
			dirs[k] |= dir
		}
	}
	// Newest first: the latest version's complaints matter most.
	for i := len(against) - 1; i >= 0; i-- {
		old := against[i]
		if backward {
			note(readerCompatible(next, old.Schema, true), old.Version, 1)
		}
		if forward {
			note(readerCompatible(old.Schema, next, false), old.Version, 2)
		}
	}
	out := make([]Violation, 0, len(order))
	for _, k := range order {
		v := k.v
		switch dirs[k] {
		case 1:
			v.Message += fmt.Sprintf(" (consumers on the new schema cannot read data written with version %d)", k.version)
		case 2:
			v.Message += fmt.Sprintf(" (consumers on version %d cannot read data written with the new schema)", k.version)
		default:
			v.Message += fmt.Sprintf(" (consumers on version %d and on the new schema cannot read each other's data)", k.version)
		}
		out = append(out, v)
	}
	return out
}
