package docgen

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Metric is one metric family the code defines.
type Metric struct {
	Name, Help string
	Labels     []string
	// File is where it is defined, relative to the repository.
	File string
}

var metricName = regexp.MustCompile(`^relay_[a-z0-9_]+$`)

// Metrics reads every non-test Go file under root and returns the metric
// families defined there: a string literal relay_* given as a metric's
// name (the Name of an Opts literal, or the argument of a call such as
// prometheus.NewDesc or a helper that builds one) with the help that
// follows it, and the labels given beside them as a []string literal or a
// third string argument.
func Metrics(root string) ([]Metric, error) {
	found := map[string]Metric{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		ast.Inspect(file, func(n ast.Node) bool {
			var m Metric
			switch n := n.(type) {
			case *ast.CallExpr:
				m = fromCall(n)
			}
			if m.Name != "" {
				if _, dup := found[m.Name]; !dup {
					m.File = filepath.ToSlash(rel)
					found[m.Name] = m
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]Metric, 0, len(found))
	for _, m := range found {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// fromOpts reads prometheus.XxxOpts{Name: "relay_...", Help: "..."}.
func fromOpts(lit *ast.CompositeLit) Metric {
	var m Metric
	for _, e := range lit.Elts {
		kv, ok := e.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		key, ok := kv.Key.(*ast.Ident)
		if !ok {
			continue
		}
		switch s, isStr := str(kv.Value); {
		case !isStr:
		case key.Name == "Name" && metricName.MatchString(s):
			m.Name = s
		case key.Name == "Help":
			m.Help = s
		}
	}
	if m.Name == "" {
		return Metric{}
	}
	return m
}

// fromCall reads a call whose arguments hold a metric name and its help
// (prometheus.NewDesc, a helper), or an Opts literal and labels (NewXxxVec).
func fromCall(call *ast.CallExpr) Metric {
	var m Metric
	for i, a := range call.Args {
		if lit, ok := a.(*ast.CompositeLit); ok {
			if o := fromOpts(lit); o.Name != "" {
				m = o
				continue
			}
			if labels, ok := strings_(lit); ok && m.Name != "" {
				m.Labels = labels
			}
			continue
		}
		s, ok := str(a)
		if !ok {
			continue
		}
		switch {
		case m.Name == "" && metricName.MatchString(s):
			m.Name = s
			if i+1 < len(call.Args) {
				// A list of names (a scrape) is no definition.
				if h, _ := str(call.Args[i+1]); !metricName.MatchString(h) {
					m.Help = h
				}
			}
			if i+2 < len(call.Args) {
				if l, ok := str(call.Args[i+2]); ok {
					m.Labels = []string{l}
				}
			}
		}
	}
	if m.Name == "" || m.Help == "" {
		return Metric{}
	}
	return m
}

// strings_ reads a []string{"a", "b"} literal.
func strings_(lit *ast.CompositeLit) ([]string, bool) {
	arr, ok := lit.Type.(*ast.ArrayType)
	if !ok {
		return nil, false
	}
	if id, ok := arr.Elt.(*ast.Ident); !ok || id.Name != "string" {
		return nil, false
	}
	var out []string
	for _, e := range lit.Elts {
		s, ok := str(e)
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

// str evaluates a string literal, or a concatenation of them.
func str(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		l, ok1 := str(e.X)
		r, ok2 := str(e.Y)
		return l + r, ok1 && ok2
	case *ast.ParenExpr:
		return str(e.X)
	}
	return "", false
}
