package docgen

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedDocsUpToDate: docs/reference.md and the Kafka API table of
// docs/kafka-compatibility.md are what the code generates now. A new
// flag, command, config or metric, or a changed API version, fails here
// until the pages are regenerated.
func TestGeneratedDocsUpToDate(t *testing.T) {
	root := filepath.Join("..", "..")
	files, err := Files(root)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range files {
		got, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s is not what the code generates: run %s from the repository's root and commit the result\nfirst difference at line %d", path, Command, firstDiff(string(got), string(want)))
		}
	}
}

// TestReferenceNamesEverything: the generated reference holds the commands,
// flags and metrics the code has, read back from the page (a guard on the
// generator itself).
func TestReferenceNamesEverything(t *testing.T) {
	ref, err := Reference(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	text := string(ref)
	for _, want := range []string{
		"### relay run\n", "### relay migrate up\n", "### relay topics create\n", "### relay-dev bench broker\n", "### relay-dev demo\n",
		"| `--database-url` |", "| `--listener-users-file` |", "| `retention.ms` |",
		"| `relay_events_published_total` | topic |", "| `relay_heartbeat_age_seconds` |", "| `relay_kafka_group_lag_records` | group, topic, partition |",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the reference lacks %q", want)
		}
	}
}

func firstDiff(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range al {
		if i >= len(bl) || al[i] != bl[i] {
			return i + 1
		}
	}
	return len(al) + 1
}
