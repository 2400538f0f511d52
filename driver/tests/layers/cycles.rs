//! The cycle rule: at every level of the tree, the imports between sibling modules (the
//! files and folders of one folder) form no cycle.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;

use crate::rules::allowed;
use crate::tree::{is_ancestor, show, where_, Crate, Edge, ModPath};

/// Sibling graph: for each module, the siblings it imports, with the imports that make
/// each edge.
type Graph<'a> = BTreeMap<ModPath, BTreeMap<ModPath, Vec<&'a Edge>>>;

/// Cycles among the siblings of every folder.
pub fn cycles(c: &Crate, used: &mut BTreeSet<usize>) -> Vec<String> {
    let graph = sibling_graph(c, used);
    strongly_connected(&graph)
        .iter()
        .filter(|s| s.len() > 1)
        .map(|scc| cycle_message(&graph, &shortest_cycle(&graph, scc)))
        .collect()
}

/// For an edge a::b::x -> a::c::y, the edge b -> c under a. Containment (a module and its
/// own children) makes no edge; an allowed import is marked used and left out.
fn sibling_graph<'a>(c: &'a Crate, used: &mut BTreeSet<usize>) -> Graph<'a> {
    let mut graph: Graph<'a> = BTreeMap::new();
    for e in &c.edges {
        if is_ancestor(&e.from, &e.to) || is_ancestor(&e.to, &e.from) {
            continue;
        }
        if let Some(k) = allowed(e) {
            used.insert(k);
            continue;
        }
        let k = e.from.iter().zip(&e.to).take_while(|(a, b)| a == b).count();
        graph
            .entry(e.from[..=k].to_vec())
            .or_default()
            .entry(e.to[..=k].to_vec())
            .or_default()
            .push(e);
    }
    graph
}

/// Tarjan's strongly connected components of the graph.
fn strongly_connected(graph: &Graph<'_>) -> Vec<Vec<ModPath>> {
    let mut t = Tarjan {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        sccs: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.sccs
}

/// The state of Tarjan's search.
struct Tarjan<'a> {
    g: &'a Graph<'a>,
    index: BTreeMap<ModPath, usize>,
    low: BTreeMap<ModPath, usize>,
    stack: Vec<ModPath>,
    on: BTreeSet<ModPath>,
    sccs: Vec<Vec<ModPath>>,
}

/// Visits `v` and what it reaches; a component is complete when `v` is its root.
fn visit(t: &mut Tarjan<'_>, v: &ModPath) {
    let n = t.index.len();
    t.index.insert(v.clone(), n);
    t.low.insert(v.clone(), n);
    t.stack.push(v.clone());
    t.on.insert(v.clone());
    let succ: Vec<ModPath> =
        t.g.get(v)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
    for w in succ {
        if !t.index.contains_key(&w) {
            visit(t, &w);
            let lw = t.low[&w];
            let lv = t.low.get_mut(v).expect("visited");
            *lv = (*lv).min(lw);
        } else if t.on.contains(&w) {
            let iw = t.index[&w];
            let lv = t.low.get_mut(v).expect("visited");
            *lv = (*lv).min(iw);
        }
    }
    if t.low[v] == t.index[v] {
        let mut scc = Vec::new();
        while let Some(w) = t.stack.pop() {
            t.on.remove(&w);
            let done = w == *v;
            scc.push(w);
            if done {
                break;
            }
        }
        t.sccs.push(scc);
    }
}

/// One shortest cycle through the component's first module, by breadth-first search: the
/// modules in order, the first one again at the end.
fn shortest_cycle<'g>(graph: &'g Graph<'_>, scc: &'g [ModPath]) -> Vec<&'g ModPath> {
    let set: BTreeSet<&ModPath> = scc.iter().collect();
    let start = &scc[0];
    let mut prev: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    let mut closing = None;
    while let Some(a) = queue.pop_front() {
        for b in graph[a].keys().filter(|b| set.contains(b)) {
            if b == start {
                closing = Some(a);
                break;
            }
            if !prev.contains_key(b) {
                prev.insert(b, a);
                queue.push_back(b);
            }
        }
        if closing.is_some() {
            break;
        }
    }
    let mut path = vec![start];
    let mut at = closing.expect("a strongly connected component has a cycle");
    while at != start {
        path.push(at);
        at = prev[at];
    }
    path[1..].reverse();
    path.push(start);
    path
}

/// The error for a cycle: its modules, then for each step one import that makes it.
fn cycle_message(graph: &Graph<'_>, path: &[&ModPath]) -> String {
    let mut msg = format!(
        "module cycle: {}",
        path.iter()
            .map(|m| show(m))
            .collect::<Vec<_>>()
            .join(" -> ")
    );
    for w in path.windows(2) {
        let e = graph[w[0]][w[1]][0];
        let _ = write!(msg, "\n    {} -> {}: {}", show(w[0]), show(w[1]), where_(e));
    }
    msg.push_str(
        "\n    rule: siblings must not import each other both ways; give the shared items a \
         home of their own that both import",
    );
    msg
}
