package doctest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository, from this package's directory.
var root = filepath.Join("..", "..")

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFaultCatalogueNamesRealTests: every test docs/faults.md cites as
// `TestName` (package) is a func TestName( (or FuzzName) in a _test.go
// file of that package, so the catalogue cannot point at a test that was
// renamed or removed.
func TestFaultCatalogueNamesRealTests(t *testing.T) {
	page := read(t, "docs/faults.md")
	cite := regexp.MustCompile("`((?:Test|Fuzz)[A-Za-z0-9_]+)` \\(([a-z0-9_/]+)\\)")
	cited := cite.FindAllStringSubmatch(page, -1)
	if len(cited) < 40 {
		t.Fatalf("docs/faults.md cites %d tests as `TestName` (package); the catalogue is meant to name each fault's tests", len(cited))
	}
	for _, c := range cited {
		name, pkg := c[1], c[2]
		if !definesTest(t, filepath.Join(root, pkg), name) {
			t.Errorf("docs/faults.md names %s in %s, but no _test.go file there has func %s(", name, pkg, name)
		}
	}
	// A test name without its package is a citation the check above misses.
	bare := regexp.MustCompile("`((?:Test|Fuzz)[A-Za-z0-9_]+)`")
	for _, m := range bare.FindAllStringIndex(page, -1) {
		if !cite.MatchString(page[m[0]:]) || cite.FindStringIndex(page[m[0]:])[0] != 0 {
			t.Errorf("docs/faults.md names %s without its package in parentheses", page[m[0]:m[1]])
		}
	}
}

func definesTest(t *testing.T, dir, name string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "func "+name+"(") {
			return true
		}
	}
	return false
}

// TestEveryAlertHasARunbookEntry: each alert of monitoring/alerts.yml has
// a "### AlertName" entry under "## Runbook" in docs/operating.md, saying
// what it means, what to check and what to do; and no entry is for an
// alert that does not exist.
func TestEveryAlertHasARunbookEntry(t *testing.T) {
	rules := read(t, "monitoring/alerts.yml")
	alerts := regexp.MustCompile(`(?m)^\s*- alert:\s*(\S+)\s*$`).FindAllStringSubmatch(rules, -1)
	if len(alerts) == 0 {
		t.Fatal("no alerts found in monitoring/alerts.yml")
	}
	page := read(t, "docs/operating.md")
	start := strings.Index(page, "\n## Runbook\n")
	if start < 0 {
		t.Fatal(`docs/operating.md has no "## Runbook" section`)
	}
	runbook := page[start+1:]
	if end := strings.Index(runbook[len("## Runbook"):], "\n## "); end >= 0 {
		runbook = runbook[:len("## Runbook")+end]
	}
	entries := map[string]string{}
	for _, part := range strings.Split(runbook, "\n### ")[1:] {
		name, body, _ := strings.Cut(part, "\n")
		entries[strings.TrimSpace(name)] = body
	}
	for _, a := range alerts {
		name := a[1]
		body, ok := entries[name]
		if !ok {
			t.Errorf("alert %s (monitoring/alerts.yml) has no runbook entry: add \"### %s\" under \"## Runbook\" in docs/operating.md", name, name)
			continue
		}
		for _, part := range []string{"**What it means**", "**What to check**", "**What to do**"} {
			if !strings.Contains(body, part) {
				t.Errorf("runbook entry %s lacks %s", name, part)
			}
		}
		delete(entries, name)
	}
	for name := range entries {
		t.Errorf("docs/operating.md has a runbook entry for %s, which monitoring/alerts.yml does not define", name)
	}
}

// TestDocsLinksResolve: every relative link in README.md and docs/*.md
// names a file or directory of the repository, every #anchor a heading of
// its page (as GitHub makes anchors), and no page refers to paths outside
// the repository.
func TestDocsLinksResolve(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"))
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, bad := range []string{"../shared", "/work/"} {
			if strings.Contains(text, bad) {
				t.Errorf("%s refers to %s, outside the repository", page, bad)
			}
		}
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(target, "#")
			file := page
			if target != "" {
				file = filepath.Join(filepath.Dir(page), target)
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s links to %s, which does not exist", page, m[1])
				continue
			}
			if anchor != "" && !anchors(t, file)[anchor] {
				t.Errorf("%s links to %s, but %s has no heading with the anchor #%s", page, m[1], file, anchor)
			}
		}
	}
}

// anchors returns the anchors GitHub gives the headings of a markdown
// file: lower case, punctuation dropped, spaces as dashes, -1, -2, ... for
// repeats.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var slug strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				slug.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				slug.WriteRune(r)
			}
		}
		a := slug.String()
		for i := 1; out[a]; i++ {
			a = fmt.Sprintf("%s-%d", slug.String(), i)
		}
		out[a] = true
	}
	return out
}
