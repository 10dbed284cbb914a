package chartcheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	op   string
	rest string
}

func parseDockerfile(t *testing.T, data string) [][]instruction {
	t.Helper()
	var stages [][]instruction
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		op, rest, _ := strings.Cut(line, " ")
		in := instruction{op: strings.ToUpper(op), rest: strings.TrimSpace(rest)}
		if in.op == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("Dockerfile: %s before FROM", in.op)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	for _, line := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	return stages
}

// execForm parses an instruction's JSON array (exec form); shell form is
// an error, since the runtime image has no shell.
func execForm(t *testing.T, in instruction, rest string) []string {
	t.Helper()
	var argv []string
	if err := json.Unmarshal([]byte(rest), &argv); err != nil || len(argv) == 0 {
		t.Errorf("Dockerfile: %s %s is not in exec form (a JSON array): the runtime image has no shell", in.op, rest)
	}
	return argv
}

// TestDockerfile checks the Dockerfile without a Docker engine: a static,
// trimmed build; a runtime stage on distroless static or scratch, as a
// non-root user, without RUN or any shell form; a HEALTHCHECK in exec form
// running `relay healthcheck` on the port CMD's --http-addr listens on;
// and CMD's flags are the relay's.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(t, string(data))
	if len(stages) < 2 {
		t.Fatalf("Dockerfile: %d stages, want a build stage and a runtime stage", len(stages))
	}
	var built bool
	for _, in := range stages[0] {
		if in.op == "RUN" && strings.Contains(in.rest, "go build") {
			built = true
			if !strings.Contains(in.rest, "CGO_ENABLED=0") || !strings.Contains(in.rest, "-trimpath") || !strings.Contains(in.rest, "./cmd/relay") {
				t.Errorf("Dockerfile: the build is not CGO_ENABLED=0 go build -trimpath ./cmd/relay: %s", in.rest)
			}
		}
	}
	if !built {
		t.Error("Dockerfile: the first stage does not go build")
	}
	runtime := stages[len(stages)-1]
	base := strings.Fields(runtime[0].rest)[0]
	if !regexp.MustCompile(`^(gcr\.io/distroless/static(-debian[0-9]+)?:nonroot|scratch)$`).MatchString(base) {
		t.Errorf("Dockerfile: runtime base %s, want distroless static :nonroot or scratch", base)
	}
	var user string
	var entrypoint, cmd, health []string
	for _, in := range runtime[1:] {
		switch in.op {
		case "RUN":
			t.Errorf("Dockerfile: RUN in the runtime stage needs a shell: %s", in.rest)
		case "SHELL":
			t.Errorf("Dockerfile: SHELL in the runtime stage")
		case "USER":
			user = in.rest
		case "ENTRYPOINT":
			entrypoint = execForm(t, in, in.rest)
		case "CMD":
			cmd = execForm(t, in, in.rest)
		case "HEALTHCHECK":
			// Options (--interval=...) come before CMD.
			_, after, ok := strings.Cut(in.rest, "CMD ")
			if !ok {
				t.Errorf("Dockerfile: HEALTHCHECK %s has no CMD", in.rest)
				continue
			}
			health = execForm(t, in, strings.TrimSpace(after))
		case "COPY":
			if strings.Contains(in.rest, " /data") && !strings.Contains(in.rest, "--chown=65532:65532") {
				t.Errorf("Dockerfile: /data is not owned by the runtime user: COPY %s", in.rest)
			}
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if uid == "" || uid == "0" || uid == "root" || !regexp.MustCompile(`^[0-9]+$`).MatchString(uid) {
		t.Errorf("Dockerfile: USER %q, want a numeric non-root UID (Kubernetes' runAsNonRoot checks the number)", user)
	}
	if len(entrypoint) != 1 || entrypoint[0] != "/usr/local/bin/relay" {
		t.Fatalf("Dockerfile: ENTRYPOINT %q, want [\"/usr/local/bin/relay\"]", entrypoint)
	}
	if len(health) < 2 || health[0] != entrypoint[0] || health[1] != "healthcheck" {
		t.Fatalf("Dockerfile: HEALTHCHECK %q does not run relay healthcheck", health)
	}
	_, runFlags := checkRelayArgs(t, "Dockerfile CMD", cmd, nil)
	_, hcFlags := checkRelayArgs(t, "Dockerfile HEALTHCHECK", health[1:], nil)
	if cmd[0] != "run" {
		t.Fatalf("Dockerfile: CMD %q does not run the daemon", cmd)
	}
	httpPort := listenPort(t, "Dockerfile CMD", "http-addr", runFlags["http-addr"], true)
	url := hcFlags["url"]
	if url == "" {
		url = "http://127.0.0.1:9464/healthz" // the command's default
	}
	if want := "http://127.0.0.1:" + strconv.Itoa(int(httpPort)) + "/healthz"; url != want {
		t.Errorf("Dockerfile: HEALTHCHECK asks %s, CMD serves %s", url, want)
	}
	if runFlags["data-dir"] != "/data" {
		t.Errorf("Dockerfile: CMD --data-dir %q, want the VOLUME /data", runFlags["data-dir"])
	}
}
