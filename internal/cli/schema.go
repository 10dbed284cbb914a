package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/outboxrelay/relay/internal/registry"
)

func schemaCommand() *command {
	return &command{
		name:    "schema",
		summary: "check schema files against their contracts, and register them",
		sub: []*command{
			{name: "check", summary: "compare schema files with the registered versions (--against registry) or with the files at a git revision (--against git:REV); exit 1 on a breaking change", run: schemaCheck, readOnly: true},
			{name: "register", summary: "register schema files in the embedded registry, each as its subject's next version, if all are compatible", run: schemaRegister},
		},
	}
}

type schemaFlags struct {
	db      dbFlags
	dir     string
	against string
	level   string
}

func (f *schemaFlags) parse(name string, stdio IO, args []string, check bool) error {
	fs := flagSet("relay schema "+name, stdio)
	f.db.register(fs)
	fs.StringVar(&f.dir, "dir", "schemas", "directory of schema files: <subject>.avsc (Avro), <subject>.json (JSON Schema) or <subject>.proto (Protobuf), e.g. orders-value.avsc for topic orders")
	if check {
		fs.StringVar(&f.against, "against", "registry", "what to compare with: registry (the versions registered in the database) or git:REV (the files' versions in the commits up to REV)")
		fs.StringVar(&f.level, "compatibility", "", "compatibility level to check under (default: each subject's level in the registry; with git:REV, "+registry.DefaultCompatibility+")")
	}
	if err := parse(fs, args, stdio, false); err != nil {
		return err
	}
	if f.level != "" {
		l, err := registry.ParseLevel(f.level)
		if err != nil {
			return usagef("--compatibility: %v", err)
		}
		f.level = l
	}
	if f.against != "registry" && !strings.HasPrefix(f.against, "git:") || f.against == "git:" {
		return usagef("--against %q: must be registry or git:REV", f.against)
	}
	return nil
}

// verdict is one schema file's comparison.
type verdict struct {
	file       registry.File
	level      string
	against    []registry.Checked
	violations []registry.Violation
	// same: the file is one of the versions already.
	same bool
}

func (v verdict) print(stdio IO) {
	switch {
	case len(v.against) == 0:
		fmt.Fprintf(stdio.Stdout, "%s (%s): new subject, nothing to compare with\n", v.file.Subject, v.file.Path)
	case v.same:
		fmt.Fprintf(stdio.Stdout, "%s (%s): unchanged\n", v.file.Subject, v.file.Path)
	case len(v.violations) == 0:
		fmt.Fprintf(stdio.Stdout, "%s (%s): compatible under %s\n", v.file.Subject, v.file.Path, v.level)
	default:
		fmt.Fprintf(stdio.Stdout, "%s (%s): %d breaking change(s) under %s:\n", v.file.Subject, v.file.Path, len(v.violations), v.level)
		for _, x := range v.violations {
			fmt.Fprintf(stdio.Stdout, "  - %s\n", x)
		}
	}
}

func schemaCheck(ctx context.Context, stdio IO, args []string) error {
	var f schemaFlags
	if err := f.parse("check", stdio, args, true); err != nil {
		return err
	}
	files, err := registry.LoadDir(f.dir)
	if err != nil {
		return err
	}
	var verdicts []verdict
	if rev, ok := strings.CutPrefix(f.against, "git:"); ok {
		verdicts, err = checkGit(ctx, files, rev, f.level)
	} else {
		verdicts, err = checkRegistry(ctx, &f, files)
	}
	if err != nil {
		return err
	}
	return reportVerdicts(stdio, verdicts)
}

func reportVerdicts(stdio IO, verdicts []verdict) error {
	broken := 0
	for _, v := range verdicts {
		v.print(stdio)
		if len(v.violations) > 0 {
			broken++
		}
	}
	if broken > 0 {
		return fmt.Errorf("%d of %d schema(s) break their contract", broken, len(verdicts))
	}
	return nil
}

func checkRegistry(ctx context.Context, f *schemaFlags, files []registry.File) ([]verdict, error) {
	conn, _, err := f.db.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	store, err := registry.NewStore(conn, f.db.schema)
	if err != nil {
		return nil, err
	}
	var out []verdict
	for _, file := range files {
		earlier, registered, err := store.Earlier(ctx, file.Subject, file.Schema)
		if err != nil {
			return nil, err
		}
		level := f.level
		if level == "" {
			if level, err = store.Level(ctx, file.Subject); err != nil {
				return nil, err
			}
		}
		v := verdict{file: file, level: level, against: earlier, same: registered != nil}
		if !v.same {
			v.violations = registry.Check(level, file.Schema, earlier)
		}
		out = append(out, v)
	}
	return out, nil
}

// checkGit compares each file with its versions in the commits up to rev
// (oldest first, each distinct schema once), so the transitive levels see
// the file's whole history.
func checkGit(ctx context.Context, files []registry.File, rev, level string) ([]verdict, error) {
	if level == "" {
		level = registry.DefaultCompatibility
	}
	var out []verdict
	for _, file := range files {
		dir, name := filepath.Dir(file.Path), filepath.Base(file.Path)
		commits, err := git(ctx, dir, "log", "--format=%H", "--max-count=200", rev, "--", name)
		if err != nil {
			return nil, err
		}
		hashes := strings.Fields(commits)
		var earlier []registry.Checked
		seen := map[[32]byte]bool{}
		for i := len(hashes) - 1; i >= 0; i-- {
			text, err := git(ctx, dir, "show", hashes[i]+":./"+name)
			if err != nil {
				// Deleted in that commit: nothing to compare with there.
				continue
			}
			sch, err := registry.Parse(file.Type, text)
			if err != nil {
				return nil, fmt.Errorf("%s at %s: %w", file.Path, hashes[i][:12], err)
			}
			if !seen[sch.Fingerprint()] {
				seen[sch.Fingerprint()] = true
				earlier = append(earlier, registry.Checked{Version: len(earlier) + 1, Schema: sch})
			}
		}
		v := verdict{file: file, level: level, against: earlier, same: len(earlier) > 0 && earlier[len(earlier)-1].Schema.Fingerprint() == file.Schema.Fingerprint()}
		if !v.same {
			v.violations = registry.Check(level, file.Schema, earlier)
		}
		out = append(out, v)
	}
	return out, nil
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("git %s: %s", strings.Join(args, " "), strings.TrimSpace(stderr.String()))
		}
		return "", fmt.Errorf("running git: %w", err)
	}
	return string(out), nil
}

func schemaRegister(ctx context.Context, stdio IO, args []string) error {
	var f schemaFlags
	f.against = "registry"
	if err := f.parse("register", stdio, args, false); err != nil {
		return err
	}
	files, err := registry.LoadDir(f.dir)
	if err != nil {
		return err
	}
	// All or nothing: a breaking file registers none of them.
	verdicts, err := checkRegistry(ctx, &f, files)
	if err != nil {
		return err
	}
	for _, v := range verdicts {
		if len(v.violations) > 0 {
			return fmt.Errorf("nothing registered: %w", reportVerdicts(stdio, verdicts))
		}
	}
	conn, _, err := f.db.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	store, err := registry.NewStore(conn, f.db.schema)
	if err != nil {
		return err
	}
	for _, file := range files {
		v, err := store.Register(ctx, file.Subject, file.Type, file.Text)
		if err != nil {
			return fmt.Errorf("%s: %w", file.Path, err)
		}
		fmt.Fprintf(stdio.Stdout, "%s (%s): version %d, schema id %d\n", file.Subject, file.Path, v.Version, v.ID)
	}
	return nil
}
