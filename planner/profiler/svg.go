package profiler

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/planner/perf"
)

// The picture's geometry, in SVG user units.
const (
	svgWidth, svgHeight = 1000, 440
	panelWidth          = 400 // a plot's area
	panelHeight         = 300
	marginLeft          = 70
	marginTop           = 50
	panelGap            = 100
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"}

// WriteSVG draws p as an SVG picture of two plots: time to first token
// against input length (the measured points and the fitted profile's
// perf.PrefillTime as a line) and inter-token latency against
// concurrency, one line per context length (the measured points and the
// fitted decode step). Both horizontal axes are logarithmic. Without a
// sweep it draws the fitted curves over the default sweep's ranges.
func WriteSVG(w io.Writer, p sim.Profile) error {
	m, err := perf.FromProfile(p)
	if err != nil {
		return err
	}
	var sw sim.Sweep
	if p.Sweep != nil {
		sw = *p.Sweep
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, svgHeight, svgWidth, svgHeight)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgWidth, svgHeight)
	b.WriteString(`<title>`)
	xml.EscapeText(&b, []byte("profile: "+p.Source))
	b.WriteString("</title>\n")

	// Prefill: TTFT against ISL.
	isls := []float64{128, 32768}
	var measured [][2]float64
	for _, pt := range sw.Prefill {
		measured = append(measured, [2]float64{float64(pt.ISL), pt.TTFTMs})
	}
	if len(measured) > 0 {
		isls = isls[:0]
		for _, pt := range measured {
			isls = append(isls, pt[0])
		}
	}
	lo, hi := slices.Min(isls), slices.Max(isls)
	if hi <= lo {
		hi = lo * 2
	}
	var fit [][2]float64
	for i := range 65 {
		u := lo * math.Pow(hi/lo, float64(i)/64)
		fit = append(fit, [2]float64{u, msOf(m.PrefillTime(u))})
	}
	left := plot{x0: marginLeft, y0: marginTop, xlo: lo, xhi: hi, ymax: maxY(measured, fit),
		title: "Prefill: time to first token at batch 1", xlabel: "input length (tokens, log scale)", ylabel: "TTFT (ms)"}
	left.frame(&b)
	left.line(&b, fit, palette[0], "fit", "fitted profile (perf.PrefillTime)")
	left.points(&b, measured, palette[0], "measured")
	left.legend(&b, []legendEntry{{palette[0], "measured (circles), fitted profile (line)"}})

	// Decode: ITL against concurrency, one line per context.
	concs := map[int]bool{}
	byCtx := map[int][][2]float64{}
	for _, pt := range sw.Decode {
		concs[pt.Concurrency] = true
		byCtx[pt.Context] = append(byCtx[pt.Context], [2]float64{float64(pt.Concurrency), pt.ITLMs})
	}
	if len(byCtx) == 0 {
		for _, ctx := range []int{1024, 4096, 16384} {
			byCtx[ctx] = nil
		}
		for c := 1; c <= 64; c *= 2 {
			concs[c] = true
		}
	}
	cs := sortedKeys(concs)
	ctxs := sortedKeys(byCtx)
	clo, chi := float64(cs[0]), float64(cs[len(cs)-1])
	if chi <= clo {
		chi = clo * 2
	}
	lines := map[int][][2]float64{}
	var all [][2]float64
	for _, ctx := range ctxs {
		for _, c := range cs {
			if float64(c)*float64(ctx) > float64(m.KVTokens) {
				break
			}
			pt := [2]float64{float64(c), msOf(m.DecodeStep(c, float64(ctx)))}
			lines[ctx] = append(lines[ctx], pt)
			all = append(all, pt)
		}
		all = append(all, byCtx[ctx]...)
	}
	right := plot{x0: marginLeft + panelWidth + panelGap, y0: marginTop, xlo: clo, xhi: chi, ymax: maxY(all),
		title: "Decode: inter-token latency", xlabel: "concurrency (streams, log scale)", ylabel: "ITL (ms)"}
	right.frame(&b)
	var legend []legendEntry
	for i, ctx := range ctxs {
		col := palette[i%len(palette)]
		name := fmt.Sprintf("context %d tokens", ctx)
		right.line(&b, lines[ctx], col, "fit", name)
		right.points(&b, byCtx[ctx], col, "measured")
		legend = append(legend, legendEntry{col, name})
	}
	right.legend(&b, legend)
	b.WriteString("</svg>\n")
	_, err = w.Write(b.Bytes())
	return err
}

type legendEntry struct{ color, text string }

// plot is one panel: a log-scale x axis, a linear y axis from 0.
type plot struct {
	x0, y0                float64
	xlo, xhi, ymax        float64
	title, xlabel, ylabel string
}

func (p plot) x(v float64) float64 {
	return p.x0 + panelWidth*math.Log(v/p.xlo)/math.Log(p.xhi/p.xlo)
}

func (p plot) y(v float64) float64 { return p.y0 + panelHeight*(1-v/p.ymax) }

func (p plot) frame(b *bytes.Buffer) {
	bottom := p.y0 + panelHeight
	fmt.Fprintf(b, `<g class="axes">`+"\n")
	fmt.Fprintf(b, `<rect x="%g" y="%g" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", p.x0, p.y0, panelWidth, panelHeight)
	text(b, p.x0+panelWidth/2, p.y0-20, "middle", "title", p.title, "")
	text(b, p.x0+panelWidth/2, bottom+40, "middle", "xlabel", p.xlabel, "")
	text(b, p.x0-50, p.y0+panelHeight/2, "middle", "ylabel", p.ylabel,
		fmt.Sprintf(` transform="rotate(-90 %g %g)"`, p.x0-50, p.y0+panelHeight/2))
	// x ticks at powers of two, every other one when there are many.
	e0, e1 := math.Ceil(math.Log2(p.xlo)), math.Floor(math.Log2(p.xhi))
	step := math.Max(1, math.Ceil((e1-e0+1)/8))
	for e := e0; e <= e1; e += step {
		v := math.Exp2(e)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#444"/>`+"\n", p.x(v), bottom, p.x(v), bottom+5)
		text(b, p.x(v), bottom+18, "middle", "xtick", fmt.Sprint(v), "")
	}
	ys := niceStep(p.ymax / 5)
	for v := 0.0; v <= p.ymax; v += ys {
		fmt.Fprintf(b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/>`+"\n", p.x0, p.y(v), p.x0+panelWidth, p.y(v))
		text(b, p.x0-6, p.y(v)+4, "end", "ytick", fmt.Sprint(round(v)), "")
	}
	b.WriteString("</g>\n")
}

func (p plot) line(b *bytes.Buffer, pts [][2]float64, color, class, name string) {
	if len(pts) == 0 {
		return
	}
	fmt.Fprintf(b, `<polyline class="%s" fill="none" stroke="%s" stroke-width="2" points="`, class, color)
	for i, pt := range pts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(b, "%.1f,%.1f", p.x(pt[0]), p.y(pt[1]))
	}
	b.WriteString(`"><title>`)
	xml.EscapeText(b, []byte(name))
	b.WriteString("</title></polyline>\n")
}

func (p plot) points(b *bytes.Buffer, pts [][2]float64, color, class string) {
	for _, pt := range pts {
		fmt.Fprintf(b, `<circle class="%s" cx="%.1f" cy="%.1f" r="4" fill="none" stroke="%s" stroke-width="1.5"><title>%g, %g ms</title></circle>`+"\n",
			class, p.x(pt[0]), p.y(pt[1]), color, pt[0], round(pt[1]))
	}
}

func (p plot) legend(b *bytes.Buffer, entries []legendEntry) {
	for i, e := range entries {
		y := p.y0 + 16 + float64(i)*16
		fmt.Fprintf(b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2"/>`+"\n", p.x0+10, y-4, p.x0+30, y-4, e.color)
		text(b, p.x0+36, y, "start", "legend", e.text, "")
	}
}

func text(b *bytes.Buffer, x, y float64, anchor, class, s, extra string) {
	fmt.Fprintf(b, `<text class="%s" x="%.1f" y="%.1f" text-anchor="%s"%s>`, class, x, y, anchor, extra)
	xml.EscapeText(b, []byte(s))
	b.WriteString("</text>\n")
}

// maxY is the y axis's top: the largest y of the series and a tenth more.
func maxY(series ...[][2]float64) float64 {
	top := 0.0
	for _, s := range series {
		for _, pt := range s {
			if !math.IsInf(pt[1], 0) && !math.IsNaN(pt[1]) {
				top = max(top, pt[1])
			}
		}
	}
	if top <= 0 {
		return 1
	}
	return top * 1.1
}

// niceStep is the 1, 2 or 5 × 10ⁿ at least v.
func niceStep(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, f := range []float64{1, 2, 5, 10} {
		if f*e >= v {
			return f * e
		}
	}
	return 10 * e
}

func sortedKeys[V any](m map[int]V) []int {
	ks := make([]int, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
