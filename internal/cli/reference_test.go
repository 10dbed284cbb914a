package cli

import (
	"flag"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestReferenceFlagTableMatchesRun: the table of `relay run` flags in
// docs/reference.md names every flag the binary has, with its real
// default, and no other. On a mismatch the test prints the rows as they
// should be; go run ./internal/devcli/docgen rewrites the page.
func TestReferenceFlagTableMatchesRun(t *testing.T) {
	readme, err := os.ReadFile("../../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	start := strings.Index(text, "`relay run` flags:")
	if start < 0 {
		t.Fatal("docs/reference.md has no \"`relay run` flags:\" table")
	}
	row := regexp.MustCompile("^\\| `--([a-z0-9-]+)` \\| ([^|]*) \\| (.+) \\|$")
	documented := map[string]string{}
	inTable := false
	for _, line := range strings.Split(text[start:], "\n") {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		inTable = true
		if strings.HasPrefix(line, "| flag") || strings.HasPrefix(line, "|--") {
			continue
		}
		m := row.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("docs/reference.md flag row not of the form | `--flag` | default | meaning |: %s", line)
			continue
		}
		documented[m[1]] = strings.Trim(strings.TrimSpace(m[2]), "`")
	}

	var f runFlags
	fs := flag.NewFlagSet("relay run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.register(fs)
	var want strings.Builder
	ok := true
	fs.VisitAll(func(fl *flag.Flag) {
		def := fl.DefValue
		cell := ""
		if def != "" {
			cell = "`" + def + "`"
		}
		want.WriteString("| `--" + fl.Name + "` | " + cell + " | " + fl.Usage + " |\n")
		got, listed := documented[fl.Name]
		switch {
		case !listed:
			t.Errorf("--%s is not in the table of docs/reference.md (run go run ./internal/devcli/docgen)", fl.Name)
			ok = false
		case got != def:
			t.Errorf("--%s: docs/reference.md says the default is %q, the binary has %q", fl.Name, got, def)
			ok = false
		}
		delete(documented, fl.Name)
	})
	for name := range documented {
		t.Errorf("docs/reference.md lists --%s, which relay run does not have", name)
		ok = false
	}
	if !ok {
		t.Logf("the rows as they should be:\n%s", want.String())
	}
}
