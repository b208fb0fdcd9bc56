package profiler

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/engine/model/sim"
)

// svgDoc is what the tests read back of the SVG.
type svgDoc struct {
	XMLName xml.Name `xml:"svg"`
	Title   string   `xml:"title"`
	Groups  []struct {
		Texts []svgText `xml:"text"`
	} `xml:"g"`
	Texts     []svgText `xml:"text"`
	Polylines []struct {
		Class  string `xml:"class,attr"`
		Points string `xml:"points,attr"`
		Title  string `xml:"title"`
	} `xml:"polyline"`
	Circles []struct {
		Class string `xml:"class,attr"`
	} `xml:"circle"`
}

type svgText struct {
	Class string `xml:"class,attr"`
	Text  string `xml:",chardata"`
}

func readSVG(t *testing.T, p sim.Profile) svgDoc {
	t.Helper()
	var b bytes.Buffer
	if err := WriteSVG(&b, p); err != nil {
		t.Fatal(err)
	}
	var doc svgDoc
	if err := xml.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatalf("the SVG is not XML: %v\n%s", err, b.Bytes())
	}
	return doc
}

func (d svgDoc) texts(class string) []string {
	var out []string
	for _, g := range d.Groups {
		for _, tx := range g.Texts {
			if tx.Class == class {
				out = append(out, tx.Text)
			}
		}
	}
	for _, tx := range d.Texts {
		if tx.Class == class {
			out = append(out, tx.Text)
		}
	}
	return out
}

// TestSVGDrawsEveryPointAndALinePerContext reads the picture back: the
// axes say their units, every measured point is a circle, and there is
// one fitted line for prefill and one per decode context.
func TestSVGDrawsEveryPointAndALinePerContext(t *testing.T) {
	sw := sweepOf(t, sim.DefaultProfile(), []int{128, 512, 2048, 8192}, []int{1, 4, 16}, []int{1024, 4096, 16384})
	p, _, err := Fit(sw, limits, `a "quoted" <source> & more`)
	if err != nil {
		t.Fatal(err)
	}
	doc := readSVG(t, p)
	if !strings.Contains(doc.Title, `a "quoted" <source> & more`) {
		t.Errorf("title %q lacks the source", doc.Title)
	}
	labels := strings.Join(append(doc.texts("xlabel"), doc.texts("ylabel")...), "|")
	for _, want := range []string{"input length (tokens", "TTFT (ms)", "concurrency (streams", "ITL (ms)"} {
		if !strings.Contains(labels, want) {
			t.Errorf("axis labels %q lack %q", labels, want)
		}
	}
	if got, want := len(doc.Circles), len(sw.Prefill)+len(sw.Decode); got != want {
		t.Errorf("%d circles, want one per measured point: %d", got, want)
	}
	var names []string
	for _, pl := range doc.Polylines {
		if pl.Class == "fit" {
			names = append(names, pl.Title)
			if strings.Count(pl.Points, ",") < 2 {
				t.Errorf("line %q has points %q, want a line", pl.Title, pl.Points)
			}
		}
	}
	want := []string{"fitted profile (perf.PrefillTime)", "context 1024 tokens", "context 4096 tokens", "context 16384 tokens"}
	if strings.Join(names, "|") != strings.Join(want, "|") {
		t.Errorf("fitted lines %q, want %q", names, want)
	}
	legend := strings.Join(doc.texts("legend"), "|")
	for _, w := range want[1:] {
		if !strings.Contains(legend, w) {
			t.Errorf("legend %q lacks %q", legend, w)
		}
	}
}

// TestSVGOfAProfileWithoutSweep draws the curves alone.
func TestSVGOfAProfileWithoutSweep(t *testing.T) {
	doc := readSVG(t, sim.DefaultProfile())
	if len(doc.Circles) != 0 {
		t.Errorf("%d circles of a profile without measurements", len(doc.Circles))
	}
	if len(doc.Polylines) != 4 {
		t.Errorf("%d lines, want prefill and three default contexts", len(doc.Polylines))
	}
}
