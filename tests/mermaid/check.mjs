// Parses a mermaid document with the official mermaid parser (in jsdom);
// exits 1 with the parser's message if it does not parse.
import { JSDOM } from 'jsdom';
import fs from 'fs';

const dom = new JSDOM('<!doctype html><html><body></body></html>');
globalThis.window = dom.window;
globalThis.document = dom.window.document;
for (const name of ['Element', 'HTMLElement', 'Node', 'DocumentFragment', 'DOMParser']) {
  globalThis[name] = dom.window[name];
}
const { default: mermaid } = await import('mermaid');
mermaid.initialize({ startOnLoad: false });
const text = fs.readFileSync(process.argv[2], 'utf8');
try {
  const parsed = await mermaid.parse(text);
  console.log(`parsed: ${parsed.diagramType}`);
} catch (error) {
  console.error(`mermaid could not parse the graph: ${error.message}`);
  process.exit(1);
}
